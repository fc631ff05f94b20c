"""Benchmark: the integer backend's CPU time on one thread under environment settings, side by side.

For ways of running the same computation that an environment variable selects (``QACCURACY_HEAP=tuned``
against glibc's own heap parameters, say): each setting runs in its own process, the settings
interleaved round after round, one intra-op thread and OpenBLAS held to one thread. CPU time
(``time.process_time``) rather than wall time, so that a loaded machine inflates both sides alike::

    python bench/backend_cpu.py --net plain --env QACCURACY_HEAP=system --env QACCURACY_HEAP=tuned
    python bench/backend_cpu.py --net detector --size 256 --format qoperator --preset onnxruntime-avx2

Reported per setting: the best and the median CPU time of a run over all rounds, the process's peak
RSS and its minor page faults per run. The nets are those of ``bench/integer_backend.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def _model(args: argparse.Namespace) -> tuple[Path, np.ndarray]:
    """The quantized bench net and its batch, built once and kept in the temp folder."""
    import integer_backend as nets

    folder = Path(tempfile.gettempdir()) / f"qaccuracy-backend-cpu-{args.net}-{args.size}"
    folder.mkdir(exist_ok=True)
    if args.net == "detector":
        net, channels = nets.detector_net(args.size), 8
    elif args.net == "mobile":
        net, channels = nets.mobile_net(args.size), 3
    else:
        net, channels = nets.conv_net(22, 32, args.size), 32
    rng = np.random.default_rng(1)
    path = folder / f"{args.format}.onnx"
    if not path.exists():
        calibration = rng.normal(0, 1, (32, channels, args.size, args.size)).astype(np.float32)
        nets.quantize(net, calibration, folder, args.format)  # writes <format>.onnx there
    rng = np.random.default_rng(2)
    return path, rng.normal(0, 1, (args.batch, channels, args.size, args.size)).astype(np.float32)


def _child(args: argparse.Namespace) -> None:
    from pytest_qaccuracy.backend import IntegerSession

    path, batch = _model(args)
    session = IntegerSession(path, args.preset, threads=1)
    session.run(None, {"input": batch})  # warm: tables, weights, scratch
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.repeat):
        start = time.process_time()
        session.run(None, {"input": batch})
        times.append(time.process_time() - start)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"times": times, "rss": usage.ru_maxrss, "faults": (usage.ru_minflt - faults) / args.repeat}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=("plain", "detector", "mobile"), default="plain")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--format", choices=("qdq", "qoperator"), default="qdq")
    parser.add_argument("--preset", default="onnxruntime", help="the scheme (default: this machine's preset)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per process")
    parser.add_argument("--rounds", type=int, default=3, help="processes per setting, interleaved")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE[,NAME=VALUE]: one setting")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    _model(args)  # quantized once, before any timing
    settings = args.env or [""]
    seen: dict[str, list[dict]] = {s: [] for s in settings}
    child = [sys.executable, __file__, "--child", *sys.argv[1:]]
    for _ in range(args.rounds):
        for setting in settings:
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
            env.update(kv.split("=", 1) for kv in setting.split(",") if kv)
            out = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
            seen[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.net} {args.size}x{args.size}, {args.format}, batch {args.batch}, preset {args.preset}, one thread")
    print("\n| setting | best CPU ms | median CPU ms | peak RSS MB | minor faults per run |")
    print("|---|---|---|---|---|")
    for setting, runs in seen.items():
        times = [t for run in runs for t in run["times"]]
        rss = max(run["rss"] for run in runs) / 1024
        faults = statistics.median(run["faults"] for run in runs)
        print(
            f"| {setting or 'default'} | {min(times) * 1000:.1f} | {statistics.median(times) * 1000:.1f} "
            f"| {rss:.0f} | {faults:.0f} |"
        )


if __name__ == "__main__":
    main()
