#!/usr/bin/env python3
"""Turns the flashattn program's JSON into PNG plots.

  flashattn traffic --json > traffic.json
  flashattn bench --json --algorithm both ... > bench.json
  python3 tools/plot.py --traffic traffic.json --bench bench.json --out docs/img
  flashattn decode --json > decode.json; flashattn decode --paged 16 --json > decode-paged.json
  python3 tools/plot.py --decode decode.json decode-paged.json --out /tmp/plots

traffic.json -> bytes_moved.png  (bytes moved vs N, standard vs flash, forward and backward, log scale)
bench.json   -> throughput.png   (FLOP/s vs N per head_dim and causal, one line per algorithm
                                  and, for rows carrying "backend", per peer backend)
                peak_memory.png  (the library's peak extra memory per call vs N, standard vs flash,
                                  forward and backward, log scale; from "fwd_extra_bytes")
compare.json -> throughput.png   (the same from bench/compare_torch.py --json: ours, PyTorch's
                                  FlashAttention-2 and cuDNN backends, measured in one run)
decode.json  -> decode_bandwidth.png  (flashattn decode --json, one file or several, e.g. a contiguous
                                  and a --paged run: KV bytes read per second as a fraction of the
                                  machine's measured read bandwidth vs cache length, one line per
                                  batch and layout; rows skipped or not run are left out)
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


def plot_memory(rows, out):
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "fwd_extra_bytes" in r]
    d, causal = min((r["head_dim"], r["causal"]) for r in rows)  # one configuration per plot
    sel = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for alg, color in (("standard", "tab:red"), ("flash", "tab:blue")):
        for pass_, style in (("fwd", "-"), ("bwd", "--")):
            pts = sorted((r["seqlen_q"], r[f"{pass_}_extra_bytes"]) for r in sel
                         if r["algorithm"] == alg and f"{pass_}_extra_bytes" in r)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], style, color=color, marker="o",
                        label=f"{alg} {'forward' if pass_ == 'fwd' else 'backward'}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak extra memory of one call (MB)")
    r0 = sel[0]
    ax.set_title(f"{r0['device']} {r0['dtype']} B={r0['batch']} H={r0['heads']} d={d}"
                 f"{' causal' if causal else ''}: standard grows as N², flash at most as N")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


def plot_bench(rows, out):
    import matplotlib.pyplot as plt

    groups = sorted({(r["head_dim"], r["causal"]) for r in rows})
    unit, unit_name = (1e12, "TFLOP/s") if max(r["fwd_flops_per_s"] for r in rows) > 1e13 else (1e9, "GFLOP/s")
    ncols = min(len(groups), 2)
    nrows = (len(groups) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax, (d, causal) in zip(axes.flat, groups):
        sel = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
        for name in sorted({(r.get("backend") or r["algorithm"]) for r in sel}):
            pts = sorted((r["seqlen_q"], r["fwd_flops_per_s"]) for r in sel if (r.get("backend") or r["algorithm"]) == name)
            ax.plot([p[0] for p in pts], [p[1] / unit for p in pts], marker="o", label=f"{name} fwd")
            bw = sorted((r["seqlen_q"], r["bwd_flops_per_s"]) for r in sel
                        if (r.get("backend") or r["algorithm"]) == name and "bwd_flops_per_s" in r)
            if bw:
                ax.plot([p[0] for p in bw], [p[1] / unit for p in bw], "--", marker="x", label=f"{name} bwd")
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'no mask'}")
        ax.set_xlabel("N")
        ax.set_ylabel(unit_name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


def plot_decode(rows, out):
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("read_bw_fraction") is not None]
    if not rows:
        print("no measured rows in the decode JSON (every shape skipped or not run): no", out)
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lines = sorted({(r["dtype"], r["batch"], r["page_size"]) for r in rows})
    colors = {key: f"C{i}" for i, key in enumerate(sorted({(l[0], l[1]) for l in lines}))}  # one per dtype and batch
    for dtype, batch, page in lines:
        pts = sorted((r["cache_len"], r["read_bw_fraction"]) for r in rows
                     if (r["dtype"], r["batch"], r["page_size"]) == (dtype, batch, page))
        layout = f"paged {page}" if page else "contiguous"
        dtypes = "" if len({l[0] for l in lines}) == 1 else f"{dtype} "
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "--" if page else "-", marker="x" if page else "o",
                color=colors[(dtype, batch)], label=f"{dtypes}B={batch} {layout}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("cache length (tokens)")
    ax.set_ylabel("KV bytes read per second, % of read bandwidth")
    r0 = rows[0]
    threads = f", {r0['threads']} threads" if "threads" in r0 else ""
    ax.set_title(f"Decoding, one query token: {r0['machine']}{threads}\n"
                 f"{'/'.join(sorted({r['dtype'] for r in rows}))} H={r0['heads']}/{r0['heads_kv']} d={r0['head_dim']}, "
                 f"read bandwidth {r0['read_bw_bytes_per_s'] / 1e9:.0f} GB/s (measured)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traffic")
    ap.add_argument("--bench")
    ap.add_argument("--compare", help="JSON of bench/compare_torch.py")
    ap.add_argument("--compare-name", default="throughput.png")
    ap.add_argument("--decode", nargs="+", help="JSON of flashattn decode --json (one or several files)")
    ap.add_argument("--out", default="docs/img")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.traffic:
        plot_traffic(json.load(open(a.traffic)), os.path.join(a.out, "bytes_moved.png"))
    if a.bench:
        rows = json.load(open(a.bench))
        plot_bench(rows, os.path.join(a.out, "throughput.png"))
        if any("fwd_extra_bytes" in r for r in rows):
            plot_memory(rows, os.path.join(a.out, "peak_memory.png"))
    if a.compare:
        rows = []
        for r in json.load(open(a.compare)):
            for backend, name in (("ours", "flashattn"), ("fa2", "FA2 (PyTorch)"), ("cudnn", "cuDNN (PyTorch)")):
                rate = lambda key: float("nan") if r.get(key) is None else r[key] * 1e12  # noqa: E731 (null: not measured)
                rows.append({"head_dim": r["d"], "causal": r["causal"], "seqlen_q": r["n"], "backend": name,
                             "fwd_flops_per_s": rate(f"{backend}_fwd_tf"), "bwd_flops_per_s": rate(f"{backend}_bwd_tf")})
        plot_bench(rows, os.path.join(a.out, a.compare_name))
    if a.decode:
        plot_decode([r for path in a.decode for r in json.load(open(path))], os.path.join(a.out, "decode_bandwidth.png"))


if __name__ == "__main__":
    main()
