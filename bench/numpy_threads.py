"""How numpy's small ufunc loops scale over two threads in one process (why the pair correction gains
little from a second core, docs/performance.md).

The same int16 multiply, add and minimum (``out=``, no allocation) over 2^26 elements in all, on
arrays of each size: twice in a row on one thread, then once on each of two threads at once.

Usage: python bench/numpy_threads.py
"""

from __future__ import annotations

import threading
import time

import numpy as np

TOTAL = 1 << 26


def _work(size: int, total: int = TOTAL):
    values = np.random.default_rng(0).integers(0, 255, size).astype(np.int16)

    def run() -> None:
        out, zeros = np.empty_like(values), np.zeros_like(values)
        for _ in range(total // size):
            np.multiply(values, 3, out=out)
            np.add(out, 7, out=out)
            np.minimum(out, zeros, out=out)

    return run


def main() -> None:
    print("| array | one thread, twice | two threads, once each | speedup |")
    print("|---|---|---|---|")
    for size in (1 << 12, 1 << 14, 1 << 16, 1 << 17, 1 << 18, 1 << 20):
        run = _work(size)
        run()  # warm up
        start = time.perf_counter()
        run()
        run()
        serial = time.perf_counter() - start
        threads = [threading.Thread(target=run) for _ in range(2)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        both = time.perf_counter() - start
        print(f"| {size * 2 // 1024} KB | {serial * 1e3:.1f} ms | {both * 1e3:.1f} ms | {serial / both:.2f}x |")


if __name__ == "__main__":
    main()
