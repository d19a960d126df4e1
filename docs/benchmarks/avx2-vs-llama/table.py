#!/usr/bin/env python3
"""Prints the run's tables: the engine (AVX2 build) against llama.cpp (AVX2 build), per round."""
import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))


def print_round(rnd, title):
    """One folder of `MODEL-memctl.json` and `MODEL-llama.json` files as a table."""
    print(f"\n{title}\n")
    print("| model | test | memctl tok/s | llama.cpp tok/s | memctl / llama.cpp |")
    print("|---|---|---:|---:|---:|")
    for path in sorted(glob.glob(os.path.join(rnd, "*-memctl.json"))):
        if os.path.getsize(path) == 0:
            continue  # still running
        model = os.path.basename(path)[:-len("-memctl.json")]
        ours = {r["test"]: r for r in json.load(open(path))["results"]}
        llama = {}
        lpath = os.path.join(rnd, f"{model}-llama.json")
        if os.path.exists(lpath) and os.path.getsize(lpath) > 0:
            for r in json.load(open(lpath)):
                name = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
                llama[name] = r
        one = ours.get("tg128", {}).get("tokens_per_second")
        for test in ("pp512", "pp2048", "tg128"):
            a = ours.get(test, {}).get("tokens_per_second")
            b = llama.get(test)
            bt = f"{b['avg_ts']:,.1f} ± {b['stddev_ts']:.1f}" if b else "-"
            ratio = f"**{a / b['avg_ts']:.2f}x**" if a and b else "-"
            if not a and not b:
                continue  # a length this run did not measure
            print(f"| {model} | {test} | {a:,.1f} | {bt} | {ratio} |" if a else f"| {model} | {test} | - | {bt} | - |")
        for test, r in ours.items():
            if test.endswith("x4"):
                v = r["tokens_per_second"]
                print(f"| {model} | {test} (4 sequences, one batch) | {v:,.1f} ({v / one:.2f}x one) | - | - |")
        rss = max(r.get("peak_rss_bytes", 0) for r in ours.values()) / 2**20
        print(f"| {model} | peak RSS MiB | {rss:,.0f} | - | - |")


if __name__ == "__main__":
    for rnd in sorted(glob.glob(os.path.join(here, "round-*"))):
        print_round(rnd, os.path.basename(rnd))
