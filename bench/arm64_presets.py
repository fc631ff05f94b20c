"""Benchmark: the ARM64 presets against the exact path on the bench nets, in alternating rounds.

The nets of ``integer_backend.py`` (``plain``, ``detector``, ``mobile``; QDQ and QOperator forms,
quantized by ``quantize_static``) run on ``onnxruntime-vnni`` (exact int32 sums: the exact path),
``onnxruntime-arm64`` and ``onnxruntime-arm64-neon``, one run of each per round, ``--rounds`` rounds;
each preset's fastest run is reported against the exact path's fastest, with the spread of the
per-round ratios (a loaded 2-core VM swings by 10-30 % between seconds). A last run of each ARM64
preset under cProfile gives the share of its time spent in the ARM64-only code (``neon_pairs``: the
checks for -128 weight pairs and their corrections; ``kernels/neon.py``: the fixed-point add's
table), which does not depend on the machine's load::

    python bench/arm64_presets.py --net plain --rounds 5
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

PRESETS = ("onnxruntime-vnni", "onnxruntime-arm64", "onnxruntime-arm64-neon")
ARM_ONLY = ("neon_pairs.py", "kernels/neon.py")


def _share(session, feeds: dict) -> float:
    """Share of one run's time spent in the ARM64-only modules (cumulative, by cProfile)."""
    profile = cProfile.Profile()
    profile.enable()
    session.run(None, feeds)
    profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt
    own = sum(tt for (file, _, _), (_, _, tt, _, _) in stats.stats.items() if file.endswith(ARM_ONLY))
    return own / total if total else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--net", choices=("plain", "detector", "mobile"), default="plain")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    import integer_backend as bench

    from pytest_qaccuracy.backend import IntegerSession

    channels = {"detector": 8, "mobile": 3}.get(args.net, 32)
    net = {
        "plain": lambda: bench.conv_net(22, channels, args.size),
        "detector": lambda: bench.detector_net(args.size),
        "mobile": lambda: bench.mobile_net(args.size),
    }[args.net]()
    rng = np.random.default_rng(1)
    calibration = rng.normal(0, 1, (32, channels, args.size, args.size)).astype(np.float32)
    batch = {"input": rng.normal(0, 1, (args.batch, channels, args.size, args.size)).astype(np.float32)}
    folder = Path(tempfile.mkdtemp(prefix="qaccuracy-arm64-bench-"))
    print(f"net {args.net} {args.size}x{args.size}, batch {args.batch}, {args.rounds} rounds")
    columns = "exact (onnxruntime-vnni) | onnxruntime-arm64 | onnxruntime-arm64-neon | round ratios | ARM64-only code"
    print(f"\n| model | {columns} |")
    print("|---|---|---|---|---|---|")
    for fmt in ("qdq", "qoperator"):
        path = bench.quantize(net, calibration, folder, fmt)
        sessions = {p: IntegerSession(path, p, threads=args.threads) for p in PRESETS}
        for session in sessions.values():
            session.run(None, batch)  # warm: tables, weights
        times = {p: [] for p in PRESETS}
        for _ in range(args.rounds):
            for preset, session in sessions.items():
                start = time.perf_counter()
                session.run(None, batch)
                times[preset].append(time.perf_counter() - start)
        best = {p: min(t) for p, t in times.items()}
        exact = best["onnxruntime-vnni"]
        rounds = [times[p][i] / times["onnxruntime-vnni"][i] for p in PRESETS[1:] for i in range(args.rounds)]
        shares = [_share(sessions[p], batch) for p in PRESETS[1:]]
        cells = [f"{best[p] * 1000:.1f} ms = {best[p] / exact:.2f}x" for p in PRESETS[1:]]
        print(
            f"| {fmt} | {exact * 1000:.1f} ms | {cells[0]} | {cells[1]} | {min(rounds):.2f}-{max(rounds):.2f}x "
            f"| {shares[0]:.1%} / {shares[1]:.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
