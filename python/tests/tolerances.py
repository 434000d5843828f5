"""What the Python suites share: the tolerance per dtype and the devices to run on.

TOL and GRAD_TOL (atol = rtol, against the float64 reference on the same rounded inputs) are keyed
by the dtype's name ("float32", "float16", "bfloat16"); tol() and grad_tol() take a NumPy dtype,
a torch dtype or such a name.
"""

TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
GRAD_TOL = {"float32": 5e-5, "float16": 1e-2, "bfloat16": 6e-2}


def _name(dtype) -> str:
    s = str(dtype)
    return s.split(".")[-1].strip("'>").replace("bf16", "bfloat16")


def tol(dtype) -> float:
    return TOL[_name(dtype)]


def grad_tol(dtype) -> float:
    return GRAD_TOL[_name(dtype)]


def torch_devices():
    """"cpu", and "cuda" where PyTorch sees a GPU and this build has its CUDA backend."""
    import torch

    import flashattn
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() and flashattn.cuda_available() else [])
