"""The reference SGEMM rate for `memctl bench engine`'s `mm512` case.

Times, with numpy's OpenBLAS, the same products: every projection of every layer of the
default model (SmolLM2-135M: 30 layers, width 576, q/k/v 960, gate/up 2 x 1536) on 512
rows, as x @ w.T with w stored (out, in) like the engine's weights. Prints GFLOP/s and
the tokens per second the products alone would allow prefill.

    python3 -m venv /tmp/sgemm && /tmp/sgemm/bin/pip install numpy threadpoolctl
    /tmp/sgemm/bin/python docs/benchmarks/prefill/sgemm.py [ROWS] [REPEATS]
"""

import sys
import time

import numpy as np
from threadpoolctl import threadpool_info

LAYERS, WIDTH, QKV, FF = 30, 576, 960, 1536


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rng = np.random.default_rng(0)
    shapes = [(WIDTH, QKV), (WIDTH, WIDTH), (WIDTH, 2 * FF), (FF, WIDTH)]  # (in, out)
    weights = [
        [rng.uniform(-1, 1, (out, k)).astype(np.float32) for (k, out) in shapes]
        for _ in range(LAYERS)
    ]
    inputs = {k: rng.uniform(-1, 1, (rows, k)).astype(np.float32) for (k, _) in shapes}
    flops = 2.0 * rows * LAYERS * sum(k * out for (k, out) in shapes)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for layer in weights:
            for (k, _), w in zip(shapes, layer):
                inputs[k] @ w.T
        times.append(time.perf_counter() - start)
    median = sorted(times[1:])[len(times[1:]) // 2]
    blas = threadpool_info()[0]
    print(
        f"{blas['internal_api']} {blas['version']} ({blas['architecture']}, "
        f"{blas['num_threads']} threads): mm{rows} {rows / median:.1f} tok/s, "
        f"{flops / median / 1e9:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
