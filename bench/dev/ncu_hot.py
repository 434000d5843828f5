#!/usr/bin/env python3
"""The hottest SASS instructions of one Nsight Compute report, by warp-stall samples.

Reads the CSV of `ncu -i REPORT --page source --print-source sass --csv` on stdin (the columns
ncu names; it must have been collected with source counters, e.g. `--set full`) and prints the
TOP instructions by the sampled-stall column, with their share of all samples and, when ncu gives
them, the per-reason breakdown columns that are nonzero.

    ncu -i r.ncu-rep --page source --print-source sass --csv | python3 bench/dev/ncu_hot.py --top 25

--opcodes: executed warp instructions per opcode (millions), the largest first.
--blocks: the kernel as runs of consecutive instructions with the same execution count (straight-
line code: a loop body, a tile's prologue, an epilogue), in address order, each with its length,
executions, executed instructions and share of the stall samples (all, and of the reason named by
--reason, default stall_wait), and its commonest opcodes: where a kernel spends its instructions
and its stalls per region, to set against another kernel's (ours against cuDNN's: docs/perf/log.md,
P-120). scripts/dev/gpu-profile keeps each report's CSV (gzip): zcat it into this script.
"""
import collections
import re
import argparse
import csv
import sys


def number(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--opcodes", action="store_true")
    ap.add_argument("--blocks", action="store_true")
    ap.add_argument("--reason", default="stall_wait")
    ap.add_argument("--min-share", type=float, default=0.2, help="--blocks: runs below this %% of samples and instructions are left out")
    a = ap.parse_args()
    lines = [l for l in sys.stdin if l.strip()]
    start = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
    if start is None:
        print("ncu_hot: no source table in the input (was the report collected with --set full?)")
        return 1
    rows = list(csv.DictReader(lines[start:]))
    if not rows:
        print("ncu_hot: empty source table")
        return 1
    cols = list(rows[0].keys())
    total_col = next((c for c in cols if "Warp Stall Sampling (All" in c), None) or \
        next((c for c in cols if "Sampling" in c), None)
    if total_col is None:
        print("ncu_hot: no stall-sampling column; columns: " + ", ".join(cols[:20]))
        return 1
    reason_cols = [c for c in cols if c.startswith("stall_") or "Stall" in c and c != total_col][:40]
    total = sum(number(r[total_col]) for r in rows) or 1.0
    exec_col = next((c for c in cols if c.strip('"') == "Instructions Executed"), None)
    if a.opcodes or a.blocks:
        if exec_col is None:
            print("ncu_hot: no 'Instructions Executed' column")
            return 1
        src_col = next((c for c in cols if c.strip('"') in ("Source", "# Source")), "Source")
        return regions(rows, total_col, exec_col, src_col, a)
    rows.sort(key=lambda r: number(r[total_col]), reverse=True)
    src_col = next((c for c in cols if c.strip('"') in ("Source", "# Source")), "Source")
    addr_col = next((c for c in cols if "Address" in c), None)
    print(f"{'share':>6}  {'samples':>8}  {'address':>8}  instruction   (column: {total_col})")
    for r in rows[:a.top]:
        s = number(r[total_col])
        extra = ", ".join(f"{c}={r[c]}" for c in reason_cols if number(r.get(c, 0)) > 0.05 * s)
        print(f"{100 * s / total:5.1f}%  {s:8.0f}  {r.get(addr_col, '') if addr_col else '':>8}  "
              f"{r.get(src_col, '')[:70]}" + (f"   [{extra[:120]}]" if extra else ""))
    return 0


def opcode(source):
    """'@!P0 FMNMX.FTZ R1, ...' -> 'FMNMX'."""
    op = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]
    return op.split(".")[0]


def regions(rows, total_col, exec_col, src_col, a):
    """--opcodes and --blocks (rows in address order, as ncu prints them)."""
    total = sum(number(r[total_col]) for r in rows) or 1.0
    executed = sum(number(r[exec_col]) for r in rows) or 1.0
    if a.opcodes:
        ops = collections.Counter()
        for r in rows:
            ops[opcode(r[src_col])] += number(r[exec_col])
        print(f"executed warp instructions {executed / 1e6:.2f} M; per opcode (M):")
        for op, n in ops.most_common(a.top):
            print(f"  {op:14s} {n / 1e6:7.2f}  {100 * n / executed:5.1f}%")
    if a.blocks:
        runs = []
        for i, r in enumerate(rows):
            e = number(r[exec_col])
            if runs and runs[-1]["exec"] == e:
                run = runs[-1]
            else:
                run = {"start": i, "exec": e, "n": 0, "samples": 0.0, "reason": 0.0, "ops": collections.Counter()}
                runs.append(run)
            run["n"] += 1
            run["samples"] += number(r[total_col])
            run["reason"] += number(r.get(a.reason, 0))
            run["ops"][opcode(r[src_col])] += 1
        print(f"runs of equal execution count (instructions {executed / 1e6:.2f} M, samples {total:.0f}; "
              f"{a.reason}: share of all samples)")
        print(f"{'start':>6} {'len':>4} {'executions':>10} {'instr M':>8} {'samples':>7} {a.reason:>11}  opcodes")
        for run in runs:
            inst = run["exec"] * run["n"]
            if run["exec"] == 0 or (100 * run["samples"] / total < a.min_share and 100 * inst / executed < a.min_share):
                continue
            top = " ".join(f"{k}{v}" for k, v in run["ops"].most_common(6))
            print(f"{run['start']:6d} {run['n']:4d} {run['exec']:10.0f} {inst / 1e6:8.2f} {100 * run['samples'] / total:6.1f}% "
                  f"{100 * run['reason'] / total:10.1f}%  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
