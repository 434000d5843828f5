"""flashattn: exact attention that moves less data.

    import flashattn
    out = flashattn.attention(q, k, v, causal=True)        # NumPy or PyTorch, (B, S, H, D)

PyTorch autograd / torch.compile integration: ``flashattn.torch`` (imported on demand).
"""
from ._flashattn import UnsupportedError, build_info, cuda_available, last_kernel_path
from ._api import attention, attention_backward

try:
    from ._flashattn import __version__
except ImportError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = [
    "attention",
    "attention_backward",
    "cuda_available",
    "build_info",
    "last_kernel_path",
    "UnsupportedError",
    "__version__",
]


def __getattr__(name):
    # `flashattn.torch` without importing PyTorch for NumPy-only users.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'flashattn' has no attribute {name!r}")
