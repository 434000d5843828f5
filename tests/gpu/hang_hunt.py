#!/usr/bin/env python3
"""Repeat compare_torch's check cases to catch an intermittent hang and name the call that hangs.

  python3 tests/gpu/hang_hunt.py --lib build-gpu/libflashattn_torch_shim.so --cases 23 --reps 300 --seconds 60

Each repetition runs the case's forward, synchronizes, then its backward (deterministic and not),
synchronizing after each; a watchdog thread prints the phase and repetition still running after
--seconds and exits the process with status 3 (a hung kernel cannot be interrupted otherwise).
Fresh random inputs per repetition; outputs poisoned (NaN) before each call and checked to be
finite where the reference is (the check itself is compare_torch --check's job).
"""
import argparse, os, sys, threading, time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))  # compare_torch
import compare_torch as ct  # noqa: E402

state = {"phase": "start", "rep": 0}


def watchdog(seconds):
    time.sleep(seconds)
    print(f"HANG? still in {state['phase']} at repetition {state['rep']} after {seconds} s", flush=True)
    os._exit(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--cases", default="23", help="indices into compare_torch.CASES")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60)
    a = ap.parse_args()
    lib = ct.Lib(a.lib)
    threading.Thread(target=watchdog, args=(a.seconds,), daemon=True).start()
    t0 = time.time()
    for ci in (int(x) for x in a.cases.split(",")):
        if not 0 <= ci < len(ct.CASES):  # another tree's index (each tree has its own CASES)
            print(f"case {ci}: not in this tree's compare_torch.CASES ({len(ct.CASES)} cases), skipped", flush=True)
            continue
        dt, b, nq, nk, h, hkv, d, kw = ct.CASES[ci]
        bad = 0
        for r in range(a.reps):
            state["rep"] = r
            q, k, v, do, call = ct.case_inputs(dt, b, nq, nk, h, hkv, d, **kw)
            call["algo"] = "flash"
            out = torch.full_like(q, float("nan"))
            lse = torch.full((q.shape[0], h, q.shape[1]), float("nan"), device="cuda")
            state["phase"] = f"case {ci} forward"
            lib.forward(q, k, v, out, lse, **call)
            torch.cuda.synchronize()
            for det in (True, False):
                dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
                state["phase"] = f"case {ci} backward deterministic={det}"
                lib.backward(q, k, v, out, do, lse, dq, dk, dv, deterministic=det, **call)
                torch.cuda.synchronize()
                bad += int(torch.isnan(out).any() or torch.isnan(dq).any() or torch.isnan(dk).any()
                           or torch.isnan(dv).any())
        print(f"case {ci} ({str(dt)[6:]} d{d} {ct.CASES[ci][7]}): {a.reps} repetitions done, "
              f"{bad} with NaN outputs, {time.time() - t0:.1f} s", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
