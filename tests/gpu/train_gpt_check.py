#!/usr/bin/env python3
"""End-to-end check on a GPU: a small GPT whose attention is flashattn.torch.flash_attn_func,
under torch.compile(fullgraph=True), trains 20 steps on random tokens with its loss decreasing, and
its gradients match the same model (same weights, same batch) on PyTorch's SDPA.

    python tests/gpu/train_gpt_check.py [--dtype bf16|fp16|fp32] [--steps 20] [--no-compile]

Exits 0 with a "skip:" line when CUDA (or flashattn's CUDA backend) is not available; 1 when a
check fails. Gradient agreement is judged per parameter tensor as ||g_flash - g_sdpa|| / ||g_sdpa||
against a tolerance set by the dtype (both models run the same autocast dtype; the reference
difference is the two attention kernels' rounding, not the model's).
"""
import argparse
import math
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: only to exercise this script's logic on a machine without a GPU")
    ap.add_argument("--grad-tol", type=float, default=None, help="relative tolerance per parameter")
    args = ap.parse_args()

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("skip: PyTorch is not installed")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skip: no CUDA device visible to PyTorch")
        return 0
    import flashattn
    if args.device == "cuda" and not flashattn.cuda_available():
        print(f"skip: flashattn was built without its CUDA backend ({flashattn.build_info()})")
        return 0
    from flashattn.torch import flash_attn_func

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    grad_tol = args.grad_tol or {"bf16": 3e-2, "fp16": 5e-3, "fp32": 1e-4}[args.dtype]
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    hd = args.dim // args.heads

    class Attention(nn.Module):
        def __init__(self, impl):
            super().__init__()
            self.impl = impl
            self.q = nn.Linear(args.dim, args.heads * hd, bias=False)
            self.kv = nn.Linear(args.dim, 2 * args.kv_heads * hd, bias=False)
            self.o = nn.Linear(args.heads * hd, args.dim, bias=False)

        def forward(self, x):
            B, S, _ = x.shape
            q = self.q(x).view(B, S, args.heads, hd)
            k, v = self.kv(x).view(B, S, 2, args.kv_heads, hd).unbind(2)
            if self.impl == "flash":
                y = flash_attn_func(q, k, v, causal=True)                       # (B, S, H, D)
            else:
                y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True, enable_gqa=True).transpose(1, 2)
            return self.o(y.reshape(B, S, args.heads * hd))

    class Block(nn.Module):
        def __init__(self, impl):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)
            self.attn = Attention(impl)
            self.mlp = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))

    class GPT(nn.Module):
        def __init__(self, impl):
            super().__init__()
            self.tok = nn.Embedding(args.vocab, args.dim)
            self.pos = nn.Embedding(args.seq, args.dim)
            self.blocks = nn.ModuleList(Block(impl) for _ in range(args.layers))
            self.norm = nn.LayerNorm(args.dim)
            self.head = nn.Linear(args.dim, args.vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    flash_model = GPT("flash").to(dev)
    sdpa_model = GPT("sdpa").to(dev)
    sdpa_model.load_state_dict(flash_model.state_dict())

    def loss_fn(model, idx):
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(idx[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, args.vocab), idx[:, 1:].reshape(-1))

    step_flash = loss_fn if args.no_compile else torch.compile(loss_fn, fullgraph=True)
    step_sdpa = loss_fn if args.no_compile else torch.compile(loss_fn, fullgraph=True)

    gen = torch.Generator(device=dev).manual_seed(1)
    batch = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=dev, generator=gen)

    # 1) gradients of the two models on the same weights and batch
    failures = []
    lf = step_flash(flash_model, batch)
    lf.backward()
    ls = step_sdpa(sdpa_model, batch)
    ls.backward()
    worst = (0.0, "")
    for (name, pf), (_, ps) in zip(flash_model.named_parameters(), sdpa_model.named_parameters()):
        gf, gs = pf.grad.float(), ps.grad.float()
        if not torch.isfinite(gf).all():
            failures.append(f"non-finite gradient in {name}")
            continue
        rel = ((gf - gs).norm() / gs.norm().clamp_min(1e-30)).item()
        worst = max(worst, (rel, name))
        if rel > grad_tol:
            failures.append(f"gradient of {name}: relative difference {rel:.3g} > {grad_tol:g}")
    print(f"loss at init: flash {lf.item():.6f}  sdpa {ls.item():.6f}  (ln vocab = {math.log(args.vocab):.4f})")
    print(f"gradients: worst relative difference {worst[0]:.3g} ({worst[1]}), tolerance {grad_tol:g}")
    if abs(lf.item() - ls.item()) > 10 * grad_tol * abs(ls.item()):
        failures.append(f"initial losses differ: {lf.item()} vs {ls.item()}")

    # 2) train both for N steps on the same fixed batch (memorizable: the loss must fall)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0) for m in (flash_model, sdpa_model)]
    for o in opts:
        o.zero_grad(set_to_none=True)
    losses_f, losses_s = [], []
    sync()
    t0 = time.perf_counter()
    for step in range(args.steps):
        for model, fn, opt, hist in ((flash_model, step_flash, opts[0], losses_f), (sdpa_model, step_sdpa, opts[1], losses_s)):
            loss = fn(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            hist.append(loss.item())
        print(f"step {step:3d}  loss flash {losses_f[-1]:.5f}  sdpa {losses_s[-1]:.5f}")
    sync()
    print(f"{args.steps} steps of both models in {time.perf_counter() - t0:.2f} s")

    if not all(math.isfinite(x) for x in losses_f):
        failures.append("non-finite loss while training")
    elif not losses_f[-1] < 0.7 * losses_f[0]:
        failures.append(f"loss did not decrease enough: {losses_f[0]:.4f} -> {losses_f[-1]:.4f}")
    drops = sum(b < a for a, b in zip(losses_f, losses_f[1:]))
    if drops < 0.8 * (len(losses_f) - 1):
        failures.append(f"loss decreased on only {drops} of {len(losses_f) - 1} steps")
    gap = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses_f, losses_s))
    print(f"loss curves: flash {losses_f[0]:.4f} -> {losses_f[-1]:.4f}, largest relative gap to sdpa {gap:.3g}")
    if gap > 0.05:
        failures.append(f"loss curve departs from SDPA's by {gap:.3g} (relative)")

    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS: flash_attn_func trains under torch.compile(fullgraph=True) and matches SDPA")
    return 0


if __name__ == "__main__":
    sys.exit(main())
