#!/usr/bin/env python3
"""Prints the run's tables: memctl against llama.cpp, per round and build."""
import glob
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "avx2-vs-llama"))
from table import print_round  # noqa: E402

for rnd in sorted(glob.glob(os.path.join(here, "round-*", "*"))):
    print_round(rnd, os.path.relpath(rnd, here))
