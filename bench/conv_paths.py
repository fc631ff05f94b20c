"""Benchmark: each second way of computing a convolution's sums against the way that would run without it.

``backend/kernels/conv_core.py`` picks one of several paths per convolution. For each layer below, the
path it picks and the path that would compute the same sums if that one were removed run side by side
in one process, alternately, on one thread with OpenBLAS held to one thread; CPU time, best of
``--repeat`` per round over ``--rounds`` rounds; the outputs are compared (equal for exact sums)::

    OPENBLAS_NUM_THREADS=1 python bench/conv_paths.py --repeat 5 --rounds 3

The layers are those of the bench nets (``bench/integer_backend.py``) and of PP-OCRv4's detector:
MobileNet-style depthwise 3x3 and 5x5 layers, exact (8-bit integer operands, what the integer kernels
run) and float (a float ``Conv`` left in a quantized model, on the numpy kernels).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

#: name, (batch, channels, height, width), (out channels, group, kernel), stride, exact, the alternative:
#: a path forced in place of the chosen one, or ``inexact`` (the same call without ``exact``: the path
#: the sums would take without the exact-sum paths)
LAYERS = [
    ("float dw 3x3 s1 32ch 128x128", (4, 32, 128, 128), (32, 32, 3), 1, False, "RowsPath"),
    ("float dw 3x3 s1 96ch 64x64", (8, 96, 64, 64), (96, 96, 3), 1, False, "RowsPath"),
    ("float dw 3x3 s1 384ch 16x16", (8, 384, 16, 16), (384, 384, 3), 1, False, "RowsPath"),
    ("float dw 3x3 s1 192ch 32x32", (8, 192, 32, 32), (192, 192, 3), 1, False, "RowsPath"),
    ("exact dw 3x3 s1 96ch 64x64", (8, 96, 64, 64), (96, 96, 3), 1, True, "inexact"),
    ("exact dw 3x3 s2 144ch 64x64", (8, 144, 64, 64), (144, 144, 3), 2, True, "inexact"),
    ("exact dw 3x3 s1 192ch 32x32", (8, 192, 32, 32), (192, 192, 3), 1, True, "inexact"),
    ("exact dw 5x5 s1 384ch 4x6", (8, 384, 4, 6), (384, 384, 5), 1, True, "GroupedRowPath"),
    ("exact 1-d dw k5 64ch 4096", (8, 64, 4096), (64, 64, 5), 1, True, "Im2colPath"),
    ("float 3-d dw k3 32ch 8x32x32", (4, 32, 8, 32, 32), (32, 32, 3), 1, False, "Im2colPath"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="layers whose name contains this")
    args = parser.parse_args()
    print("| layer | chosen path | CPU ms | alternative | CPU ms | alternative / chosen | max abs difference |")
    print("|---|---|---|---|---|---|---|")
    for layer in LAYERS:
        if args.only in layer[0]:
            print(measure(*layer, args.rounds, args.repeat))


def measure(
    name: str, shape: tuple[int, ...], conv: tuple[int, int, int], stride: int, exact: bool, alternative: str,
    rounds: int, repeat: int,
) -> str:  # fmt: skip
    """One layer's table row: the chosen path and the alternative, alternately."""
    from pytest_qaccuracy.backend import parallel
    from pytest_qaccuracy.backend.kernels import conv_core

    m, group, k = conv
    rng = np.random.default_rng(0)
    d = len(shape) - 2
    if exact:
        x = rng.integers(-128, 128, shape).astype(np.float32)
        w = rng.integers(-127, 128, (m, shape[1] // group, *(k,) * d)).astype(np.float32)
    else:
        x = rng.normal(0, 1, shape).astype(np.float32)
        w = rng.normal(0, 0.1, (m, shape[1] // group, *(k,) * d)).astype(np.float32)
    pads = [k // 2] * (2 * d)
    chosen_by = conv_core.choose_path
    forced: list[type | None] = [None]
    picked: list[str] = []

    def choose(*a, **kw):
        kind = chosen_by(*a, **kw)
        picked.append(kind.__name__)
        return forced[0] or kind

    def run(kind: type | str | None) -> tuple[float, np.ndarray]:
        forced[0] = None if isinstance(kind, str) else kind
        as_exact = exact and kind != "inexact"
        start = time.process_time()
        y = conv_core.conv_core(x, w, group, (stride,) * d, (1,) * d, np.float32, exact=as_exact, pads=pads)
        return time.process_time() - start, y

    other = alternative if alternative == "inexact" else getattr(conv_core, alternative)
    best = {"chosen": float("inf"), "alternative": float("inf")}
    conv_core.choose_path = choose
    try:
        with parallel.using(1):
            run(None)
            run(other)  # warm both
            for _ in range(rounds):
                for key, kind in (("chosen", None), ("alternative", other)):
                    for _ in range(repeat):
                        best[key] = min(best[key], run(kind)[0])
            a, b = run(None)[1], run(other)[1]
    finally:
        conv_core.choose_path = chosen_by
    diff = float(np.abs(a.astype(np.float64) - b).max())
    if alternative == "inexact":
        alternative = f"{picked[-1]} (inexact)"
    return (
        f"| {name} | {picked[0]} | {best['chosen'] * 1000:.2f} | {alternative} | {best['alternative'] * 1000:.2f} "
        f"| {best['alternative'] / best['chosen']:.2f}x | {diff:.3g} |"
    )


if __name__ == "__main__":
    main()
