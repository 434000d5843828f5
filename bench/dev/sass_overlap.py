#!/usr/bin/env python3
"""Does the Hopper forward's softmax overlap its own P·V? Reads `cuobjdump -sass` of forward objects
and prints, per kernel, what follows the main loop's wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1) up to
the next GEMM: the waits for P·V (`W0`; `@W0` if SASS shows one predicated) and the MUFU.EX2
between them (`66M`). Overlapped: `66M W0 W0` (softmax first, then the predicated and the plain wait
of src/cuda/sm90/fwd/mainloop.cuh; ptxas emits the predicated one unpredicated). Hoisted: `W0 66M`
(ptxas moves the wait above the softmax: docs/perf/log.md, P-037, P-049). The kernel's
serial path (FwdArgs::serial_softmax, a measurement switch) adds its own wait first: `W0 66M W0 W0`.

    nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc \\
        -c src/cuda/inst/sm90_fwd_bf16_d128.cu -o /tmp/f.o && cuobjdump -sass /tmp/f.o > /tmp/f.sass
    python3 bench/dev/sass_overlap.py /tmp/f.sass
(cuobjdump needs nvdisasm on PATH: pip install nvidia-cuda-nvdisasm.)
"""
import re
import sys


def main(path):
    fn, seq, out = None, None, {}
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn, seq = m.group(1), None
            out[fn] = []
            continue
        if fn is None:
            continue
        if "DEPBAR.LE gsb0, 0x1" in line:
            seq = []
            continue
        if seq is None:
            continue
        if "HGMMA" in line or "BAR.SYNC" in line or "EXIT" in line:
            out[fn].append(" ".join(seq))
            seq = None
        elif "DEPBAR.LE gsb0, 0x0" in line:
            seq.append("@W0" if re.search(r"@!?U?P\d", line) else "W0")
        elif "MUFU.EX2" in line:
            if seq and seq[-1].endswith("M"):
                seq[-1] = f"{int(seq[-1][:-1]) + 1}M"
            else:
                seq.append("1M")
    for fn, loops in out.items():
        name = re.sub(r"^_ZN9flashattn4cuda4sm9010fwd_kernelI", "fwd_kernel<", fn)[:64]
        print(f"{name}: {' | '.join(loops) if loops else '(no wait for S)'}")


if __name__ == "__main__":
    main(sys.argv[1])
