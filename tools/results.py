#!/usr/bin/env python3
"""Writes docs/perf/results.md, the headline tables, from one JSON file per platform.

  python3 tools/results.py            # regenerate docs/perf/results.md
  python3 tools/results.py --check    # exit 1 if docs/perf/results.md differs from what it would write

docs/perf/h200.json holds the rows `bench/compare_torch.py --bench --json` wrote (the form
`tools/plot.py --compare` reads); its run's metadata is in H200 below. docs/perf/cpu-zen4.json is
an object that carries its own metadata. The JSON files are only read, never rewritten: a number
is parsed into a float that remembers its literal text, so hand-written figures print exactly as
given; computed figures (TFLOP/s, ratios) are rounded for display only.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = "docs/perf/results.md"

H200 = {
    "file": "docs/perf/h200.json",
    "machine": "one NVIDIA H200 (132 SMs, driver 580.159.04, CUDA 13.0); PyTorch 2.11's SDPA backends "
               "FlashAttention-2 (FA2) and cuDNN 9.19 in the same process; bf16",
    "date": "2026-12-01",
    "commit": "ee40239",
    "log": "P-140",
    "command": "ARCHS=90-real PY=0 scripts/dev/gpu-check "
               "(runs `python3 bench/compare_torch.py --lib build-gpu/libflashattn_torch_shim.so --bench --json …` "
               "after its tests, sanitizers and `--check`)",
    "shape": "batch·N = 16384, heads·head_dim = 2048, Nq = Nk = N; FLOPs: forward 4·B·H·N²·d (half for causal), "
             "backward 2.5× the forward",
    "measure": "per call: one call timed alone on an idle GPU, host work included (ours through the C API, "
               "PyTorch's through `scaled_dot_product_attention`), the implementations interleaved in a balanced "
               "order; back to back: 10 calls between two events, where the H200 runs at its power limit",
    "note": "The backward rows include P-138 (the dQ staging without bank conflicts). Kernel times (CUPTI) "
            "were last measured in P-136.",
    "headline": [(64, False), (128, False), (128, True), (256, False)],
    "headline_n": 16384,
}
CPU = "docs/perf/cpu-zen4.json"


class Num(float):
    """A JSON number: its float value, and its text as written in the file."""
    def __new__(cls, text):
        obj = float.__new__(cls, text)
        obj.text = text
        return obj


def load(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return json.load(f, parse_float=Num)


def txt(x):
    return x.text if isinstance(x, Num) else str(x)


def ratio(a, b):
    """a / b, or None where compare_torch.py wrote null (not measured)."""
    return None if a is None or b is None else a / b


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def mask(causal):
    return "causal" if causal else "no mask"


def header(lines, title, meta, data, log):
    lines += [f"## {title}", "",
              f"- Machine: {meta['machine']}.",
              f"- Date: {meta['date']}; log entry {log} (docs/perf/log.md); data: `{data}`.",
              f"- Command: {meta['command']}.", ""]


def h200(lines):
    m = H200
    rows = load(m["file"])
    header(lines, "H200: the Hopper kernels against PyTorch's SDPA backends", m, m["file"], m["log"])
    lines += [f"Grid: {m['shape']}. Measures: {m['measure']}. Commit {m['commit']}.", ""]
    r = lambda row, a, b: ratio(row[a], row[b])
    def span(f, sel=lambda row: True):
        v = [x for x in (f(row) for row in rows if sel(row)) if x is not None]
        return f"{min(v):.2f}–{max(v):.2f}×"
    lines += [
        f"- Forward per call: {span(lambda x: r(x, 'ours_fwd_tf', 'fa2_fwd_tf'))} FA2, "
        f"{span(lambda x: r(x, 'ours_fwd_tf', 'cudnn_fwd_tf'))} cuDNN "
        f"({span(lambda x: r(x, 'ours_fwd_tf', 'cudnn_fwd_tf'), lambda x: x['n'] >= 2048)} from N = 2048, "
        f"{span(lambda x: r(x, 'ours_fwd_tf', 'cudnn_fwd_tf'), lambda x: x['n'] < 2048)} at N = 512/1024); "
        f"back to back {span(lambda x: r(x, 'ours_fwd_tf_s', 'cudnn_fwd_tf_s'))} cuDNN.",
        f"- Backward per call: {span(lambda x: r(x, 'ours_bwd_tf', 'fa2_bwd_tf'))} FA2, "
        f"{span(lambda x: r(x, 'ours_bwd_tf', 'cudnn_bwd_tf'))} cuDNN; "
        f"back to back {span(lambda x: r(x, 'ours_bwd_tf_s', 'cudnn_bwd_tf_s'))} cuDNN.",
        f"- {m['note']}", ""]
    n = m["headline_n"]
    lines += [f"### Headline: TFLOP/s per call at N = {n}", "",
              f"| head_dim, N = {n} | ours fwd | FA2 fwd | cuDNN fwd | ours bwd | FA2 bwd | cuDNN bwd |",
              "|---|---|---|---|---|---|---|"]
    for d, causal in m["headline"]:
        row = next(x for x in rows if x["d"] == d and x["causal"] == causal and x["n"] == n)
        cells = [fmt(row[k], ".0f") for k in ("ours_fwd_tf", "fa2_fwd_tf", "cudnn_fwd_tf",
                                           "ours_bwd_tf", "fa2_bwd_tf", "cudnn_bwd_tf")]
        lines.append(f"| {d}, {mask(causal)} | " + " | ".join(cells) + " |")
    lines.append("")
    for pass_, name in (("fwd", "Forward"), ("bwd", "Backward")):
        lines += [f"### {name}, every row (TFLOP/s per call; ratios ours/peer)", "",
                  "| head_dim | mask | N | B × H | ours | FA2 | cuDNN | ours/FA2 | ours/cuDNN | "
                  "ours/cuDNN back to back |", "|---|---|---|---|---|---|---|---|---|---|"]
        for row in sorted(rows, key=lambda x: (x["d"], x["causal"], x["n"])):
            t = {k: row[f"{k}_{pass_}_tf"] for k in ("ours", "fa2", "cudnn")}
            b2b = ratio(row[f"ours_{pass_}_tf_s"], row[f"cudnn_{pass_}_tf_s"])
            lines.append(f"| {row['d']} | {mask(row['causal'])} | {row['n']} | {row['b']} × {row['h']} | "
                         f"{fmt(t['ours'], '.0f')} | {fmt(t['fa2'], '.0f')} | {fmt(t['cudnn'], '.0f')} | "
                         f"{fmt(ratio(t['ours'], t['fa2']), '.2f')} | {fmt(ratio(t['ours'], t['cudnn']), '.2f')} | "
                         f"{fmt(b2b, '.2f')} |")
        lines.append("")


def cpu(lines):
    c = load(CPU)
    b, demo = c["bench"], c["demo"]
    lines += [f"## {c['platform']}", "",
              f"- Machine: {c['machine']}.",
              f"- Peak: {txt(c['peak_gflops'])} GFLOP/s fp32, measured by `{c['peak_command']}` "
              f"(log entry {c['peak_log']}).",
              f"- Data: `{CPU}`. Source: {c['source']}", "",
              f"### {b['title']}", "",
              f"Date: {b['date']}. Command: `{b['command']}`. Log entries: forward {b['fwd_log']}, "
              f"backward {b['bwd_log']}.", "",
              "| head_dim | mask | forward GFLOP/s | % of peak | backward GFLOP/s | % of peak |",
              "|---|---|---|---|---|---|"]
    for row in b["rows"]:
        lines.append(f"| {row['d']} | {mask(row['causal'])} | {txt(row['fwd_gflops'])} | "
                     f"{100 * row['fwd_gflops'] / c['peak_gflops']:.0f} % | {txt(row['bwd_gflops'])} | "
                     f"{100 * row['bwd_gflops'] / c['peak_gflops']:.0f} % |")
    lines += ["", f"### {demo['title']}", "",
              f"Date: {demo['date']}. Command: `{demo['command']}`. Log entry {demo['log']}.", "",
              "| N | algorithm | time | GFLOP/s | extra memory | bytes moved (model) | max error |",
              "|---|---|---|---|---|---|---|"]
    for row in demo["rows"]:
        lines.append(f"| {row['n']} | {row['algorithm']} | {txt(row['time_ms'])} ms | {txt(row['gflops'])} | "
                     f"{row['extra_memory']} | {row['bytes_moved']} | {txt(row['max_error'])} |")
    lines += ["", demo["footer"], ""]


def render():
    lines = ["# Results", "",
             "Generated by `python3 tools/results.py`; do not edit. Each table comes from one JSON file in",
             "docs/perf/ and names its machine, date, command and the entry of docs/perf/log.md it came from.",
             "To change a table: add a log entry, update the JSON, run `python3 tools/results.py`.", ""]
    h200(lines)
    cpu(lines)
    return "\n".join(lines).rstrip("\n") + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {OUT} is not what would be written")
    a = ap.parse_args()
    text, path = render(), os.path.join(ROOT, OUT)
    if a.check:
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            print(f"{OUT} is out of date: run python3 tools/results.py", file=sys.stderr)
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote", OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
