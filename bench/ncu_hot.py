#!/usr/bin/env python3
"""The hottest SASS instructions of one Nsight Compute report, by warp-stall samples.

Reads the CSV of `ncu -i REPORT --page source --print-source sass --csv` on stdin (the columns
ncu names; it must have been collected with source counters, e.g. `--set full`) and prints the
TOP instructions by the sampled-stall column, with their share of all samples and, when ncu gives
them, the per-reason breakdown columns that are nonzero.

    ncu -i r.ncu-rep --page source --print-source sass --csv | python3 bench/ncu_hot.py --top 25
"""
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


if __name__ == "__main__":
    sys.exit(main())
