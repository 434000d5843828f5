#!/usr/bin/env python3
"""The repository's house rules, checked on every CTest run (no build needed but for --library):

  history     code, docs, scripts and tests describe what holds, not how it came to be: no numbered
              work periods or runs (either word followed by a number), no plans ("Next (…)"), no
              names of branches a clone does not have (exp-…), no citations of the retired diary
              (perf-log.md). docs/archive/ is the one place where such history is kept.
  references  every repository path a doc, comment or script names (docs/…, src/…, tests/…,
              scripts/…, bench/…, tools/…, python/…, include/…, examples/…) exists, and every
              "hopper-sm90.md §N" citation names a section of docs/hopper-sm90.md.
  knobs       (--library FILE) a library built without FLASHATTN_DEV_KNOBS holds no
              FLASHATTN_SM90_* string, so it reads no experiment variable.

  python3 tests/house/check_house.py [--root DIR] [--library libflashattn.a]
Exit status 1 with one line per finding.
"""
import argparse
import os
import re
import subprocess
import sys

SCANNED = ("README.md", "CMakeLists.txt", "docs", "src", "include", "tools", "scripts", "bench",
           "tests", "python", "examples", "cmake", ".ci")
SKIPPED = ("docs/archive/", "docs/data/", "docs/perf/h200.json", "docs/img/")
TEXT_EXT = (".md", ".cpp", ".hpp", ".cu", ".cuh", ".inl", ".h", ".py", ".sh", ".txt", ".cmake", ".in",
            ".toml", "")

HISTORY = [
    (re.compile(r"\b[Ss]essions? \d+"), "a numbered work period"),
    (re.compile(r"\b[Rr]uns? \d+(?:[–-]\d+)?\b(?! (?:times|reps|iterations|warps?|threads?|keys?|rows?|CTAs?))"),
     "a numbered run"),
    (re.compile(r"Next \("), "a plan for later work"),
    (re.compile(r"\bexp-[a-z0-9]+(?:-[a-z0-9]+)*\b"), "a branch name"),
    (re.compile(r"perf-log\.md|perf-log\b"), "the retired diary (docs/perf/log.md holds the log)"),
    (re.compile(r"\bdesign\.md\b"), "a document outside the repository"),
]
# A path a text names: a top-level folder of the repo followed by a file or folder name.
PATH = re.compile(r"(?<![\w./-])((?:docs|src|tests|scripts|bench|tools|python|include|examples)/[\w./+-]*[\w+-])")
SECTION = re.compile(r"hopper-sm90\.md,? §\s?(\d+(?:\.\d+)*)")


def files(root):
    for top in SCANNED:
        p = os.path.join(root, top)
        if os.path.isfile(p):
            yield top
            continue
        for d, dirs, names in os.walk(p):
            dirs[:] = [x for x in dirs if not x.startswith((".", "__pycache__"))]
            for n in names:
                rel = os.path.relpath(os.path.join(d, n), root)
                if rel.startswith(SKIPPED) or rel == "tests/house/check_house.py":
                    continue
                if os.path.splitext(n)[1] in TEXT_EXT:
                    yield rel


def sections(root):
    page = os.path.join(root, "docs", "hopper-sm90.md")
    if not os.path.exists(page):
        return set()
    found = set()
    for line in open(page, encoding="utf-8"):
        m = re.match(r"#+\s*§?\s*(\d+(?:\.\d+)*)[.\s]", line)
        if m:
            found.add(m.group(1))
    return found


def tracked(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
        return set(out.split())
    except (OSError, subprocess.CalledProcessError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--library")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    secs = sections(root)
    findings = []
    for rel in files(root):
        try:
            text = open(os.path.join(root, rel), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for no, line in enumerate(text.split("\n"), 1):
            for rx, what in HISTORY:
                m = rx.search(line)
                if m:
                    findings.append(f"{rel}:{no}: {what}: '{m.group(0)}'")
            for m in PATH.finditer(line):
                path = m.group(1).rstrip(".")
                after = line[m.end(1):m.end(1) + 1]
                if after in ("*", "<", "{", "$", "[") or path.endswith("/"):
                    continue  # a pattern (src/cuda/inst/sm90_*.cu), not a path
                # from the repository's root, or (python/tests/… naming tests/…) from a folder above
                # the file's own
                bases = [root] + [os.path.join(root, *rel.split("/")[:i]) for i in range(1, rel.count("/") + 1)]
                if not any(os.path.exists(os.path.join(b, path)) for b in bases):
                    findings.append(f"{rel}:{no}: names '{path}', which does not exist")
            for m in SECTION.finditer(line):
                if m.group(1) not in secs:
                    findings.append(f"{rel}:{no}: cites hopper-sm90.md §{m.group(1)}, not a section of docs/hopper-sm90.md")
    if args.library:
        data = open(args.library, "rb").read()
        if b"FLASHATTN_SM90_" in data:
            findings.append(f"{args.library}: holds a FLASHATTN_SM90_* string (an experiment knob in a release build)")
    for f in findings:
        print(f)
    print(f"house: {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
