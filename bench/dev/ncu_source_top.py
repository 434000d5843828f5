#!/usr/bin/env python3
"""The SASS lines of one kernel with the most warp-stall samples, from Nsight Compute's source page.

  ncu -i REPORT.ncu-rep --page source --csv --print-source sass > src.csv
  python3 bench/dev/ncu_source_top.py src.csv [N]

Prints the total samples, then the N lines with the most samples (address, share of all samples,
the instruction, and the stall reasons that have samples on that line, largest first), then the
samples summed by opcode. Column names are found by their text, so the script reads the CSV of any
Nsight Compute version that has the "Warp Stall Sampling (All Samples)" column.
"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if "Source" in l and "Sampling" in l), None)
    if start is None:
        print(f"{path}: no source table (the report has no SourceCounters section?)")
        print("\n".join(lines[:5]))
        return
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {name: i for i, name in enumerate(head)}
    all_col = next(i for i, n in enumerate(head) if n.startswith("Warp Stall Sampling (All"))
    src_col = col.get("Source", 1)
    addr_col = col.get("Address", 0)
    reasons = [i for i, n in enumerate(head) if n.lower().startswith("stall_") or n.startswith("smsp__pcsamp")]

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r, all_col) for r in body)
    print(f"{len(body)} SASS lines, {total:.0f} warp-stall samples")
    if total == 0:
        return
    for r in sorted(body, key=lambda r: -num(r, all_col))[:top]:
        why = sorted(((num(r, i), head[i]) for i in reasons if num(r, i) > 0), reverse=True)[:3]
        why_s = " ".join(f"{n.replace('stall_', '')}:{v:.0f}" for v, n in why)
        print(f"{r[addr_col]:>8} {100 * num(r, all_col) / total:5.1f}%  {r[src_col][:70]:<70} {why_s}")
    by_op = collections.Counter()
    for r in body:
        op = r[src_col].strip().split(" ")
        op = next((t for t in op if t and not t.startswith("@")), "?").split(".")[0]
        by_op[op] += num(r, all_col)
    print("by opcode: " + ", ".join(f"{op} {100 * v / total:.1f}%" for op, v in by_op.most_common(12)))


if __name__ == "__main__":
    main()
