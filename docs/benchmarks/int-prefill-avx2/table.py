#!/usr/bin/env python3
"""Prints the run's table: prefill tokens/s and projection GFLOP/s, integer (AVX2) vs f32 tiles."""
import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
rows = {}
for path in sorted(glob.glob(os.path.join(here, "round-*", "*.json"))):
    rnd = os.path.basename(os.path.dirname(path))
    model, kind = os.path.basename(path)[:-5].rsplit("-", 1)
    for r in json.load(open(path))["results"]:
        if r["test"] in ("pp512", "pp2048", "mm512"):
            v = r.get("gflop_per_second") if r["test"] == "mm512" else r["tokens_per_second"]
            rows.setdefault((model, r["test"]), {}).setdefault(kind, []).append((rnd, v))
print("| model | case | integer (AVX2 kernel) | f32 tiles | ratio |")
print("|---|---|---:|---:|---:|")
for (model, test), kinds in sorted(rows.items()):
    i = [v for _, v in kinds.get("integer", [])]
    t = [v for _, v in kinds.get("tiles", [])]
    unit = " GFLOP/s" if test == "mm512" else ""
    ratios = " / ".join(f"{a / b:.2f}x" for a, b in zip(i, t))
    print(f"| {model} | {test}{unit} | {' / '.join(f'{v:,.1f}' for v in i)} | "
          f"{' / '.join(f'{v:,.1f}' for v in t)} | {ratios} |")
