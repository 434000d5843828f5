"""flashattn: exact attention that moves less data.

    import flashattn
    out = flashattn.attention(q, k, v, causal=True)        # NumPy or PyTorch, (B, S, H, D)
    # decoding: k, v appended to the cache in place, then q attends to it
    out = flashattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k=k, v=v, causal=True)

PyTorch tensors given to ``attention`` go through ``flashattn.torch.attention`` (autograd).
PyTorch integration: ``flashattn.torch`` (imported on demand); flash-attn's interface:
``flashattn.flash_attn_interface``; Hugging Face transformers models: ``import flashattn.transformers``
and ``attn_implementation=flashattn.transformers.IMPLEMENTATION``; one sequence sharded over the
ranks of a torch.distributed group: ``flashattn.context_parallel`` (imported on demand).
"""
from ._flashattn import UnsupportedError, build_info, cuda_available, last_kernel_path
from ._api import attention, attention_backward, attention_with_kvcache, merge_partial

try:
    from ._flashattn import __version__
except ImportError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = [
    "attention",
    "attention_backward",
    "attention_with_kvcache",
    "merge_partial",
    "cuda_available",
    "build_info",
    "last_kernel_path",
    "UnsupportedError",
    "__version__",
]


def __getattr__(name):
    # `flashattn.torch` (and `flashattn.context_parallel`, which needs torch.distributed) without
    # importing PyTorch for NumPy-only users.
    if name in ("torch", "context_parallel"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'flashattn' has no attribute {name!r}")
