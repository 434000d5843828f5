#!/usr/bin/env python3
"""Turns the flashattn program's JSON into PNG plots.

  flashattn traffic --json > traffic.json
  flashattn bench --json --algorithm both ... > bench.json
  python3 tools/plot.py --traffic traffic.json --bench bench.json --out docs/img

traffic.json -> bytes_moved.png  (bytes moved vs N, standard vs flash, forward and backward, log scale)
bench.json   -> throughput.png   (FLOP/s vs N per head_dim and causal, one line per algorithm
                                  and, for rows carrying "backend", per peer backend)
"""
import argparse
import json
import os


def plot_traffic(rows, out):
    import matplotlib.pyplot as plt

    n = [r["seqlen"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for pass_, style in (("forward", "-"), ("backward", "--")):
        for alg, color in (("standard", "tab:red"), ("flash", "tab:blue")):
            ax.plot(n, [(r[pass_][alg]["read"] + r[pass_][alg]["write"]) / 1e9 for r in rows], style, color=color,
                    marker="o", label=f"{alg} {pass_}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes moved through main memory (GB)")
    ax.set_title("One attention call: standard grows as N², flash as N")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


def plot_bench(rows, out):
    import matplotlib.pyplot as plt

    groups = sorted({(r["head_dim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.8), squeeze=False)
    for ax, (d, causal) in zip(axes[0], groups):
        sel = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
        for name in sorted({r.get("backend", r["algorithm"]) for r in sel}):
            pts = sorted((r["seqlen_q"], r["fwd_flops_per_s"]) for r in sel if r.get("backend", r["algorithm"]) == name)
            ax.plot([p[0] for p in pts], [p[1] / 1e9 for p in pts], marker="o", label=f"{name} fwd")
            bw = sorted((r["seqlen_q"], r["bwd_flops_per_s"]) for r in sel
                        if r.get("backend", r["algorithm"]) == name and "bwd_flops_per_s" in r)
            if bw:
                ax.plot([p[0] for p in bw], [p[1] / 1e9 for p in bw], "--", marker="x", label=f"{name} bwd")
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'no mask'}")
        ax.set_xlabel("N")
        ax.set_ylabel("GFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traffic")
    ap.add_argument("--bench")
    ap.add_argument("--out", default="docs/img")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.traffic:
        plot_traffic(json.load(open(a.traffic)), os.path.join(a.out, "bytes_moved.png"))
    if a.bench:
        plot_bench(json.load(open(a.bench)), os.path.join(a.out, "throughput.png"))


if __name__ == "__main__":
    main()
