#!/usr/bin/env python3
"""One query token per sequence over a dense cache through PyTorch's SDPA, a few calls, for a
profiler to attach to (ncu --kernel-name ...): bf16, H 32 over Hkv 8, d 128.
usage: sdpa_decode_call.py BATCH CACHE {flash,cudnn} [CALLS]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

batch, cache, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
calls = int(sys.argv[4]) if len(sys.argv) > 4 else 3
which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(batch, 8, cache, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
with torch.no_grad(), sdpa_kernel(which):
    for _ in range(calls):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
