#!/usr/bin/env python3
"""Prints the run's tables: memctl against llama.cpp, per round and build, from this
folder or the one given (a run with OUT=folder)."""
import glob
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "avx2-vs-llama"))
from table import print_round  # noqa: E402

runs = sys.argv[1] if len(sys.argv) > 1 else here
for rnd in sorted(glob.glob(os.path.join(runs, "round-*", "*"))):
    print_round(rnd, os.path.relpath(rnd, runs))
