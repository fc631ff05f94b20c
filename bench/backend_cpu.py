"""Benchmark: the integer backend's CPU time on one thread under environment settings, side by side.

For ways of running the same computation that an environment variable selects (``QACCURACY_HEAP=tuned``
against glibc's own heap parameters, say): each setting runs in its own process, the settings
interleaved round after round, one intra-op thread and OpenBLAS held to one thread. CPU time
(``time.process_time``) rather than wall time, so that a loaded machine inflates both sides alike::

    python bench/backend_cpu.py --net plain --env QACCURACY_HEAP=system --env QACCURACY_HEAP=tuned
    python bench/backend_cpu.py --net detector --size 256 --format qoperator --preset onnxruntime-avx2
    python bench/backend_cpu.py --model .corpus/ppocr_det/qop_u8s8.onnx --records 8 --steps 10

Reported per setting: the best and the median CPU time of a run over all rounds, the process's peak
RSS, its minor page faults per run, and a digest of the outputs (equal digests: bit-identical
outputs). The nets are those of ``bench/integer_backend.py``; ``--model`` runs a corpus model on its
calibration records instead (one by one where its graph fixes the batch, as
``bench/real_model_backend.py`` does). ``--steps K`` prints the K steps whose CPU time differs most
between the settings (each step's best over the runs) and the sum of every step's best;
``--threads 2`` adds the wall time; ``--env BENCH_PRESET=onnxruntime-vnni`` runs one setting on another
preset (``--preset``: every setting's), and ``--env BENCH_SET=module.NAME=N`` sets a module's integer
constant in one setting (``;`` between several), e.g. a threshold that turns a speed path off.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
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


def _corpus(args: argparse.Namespace) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """A corpus model (with a free batch axis where onnxruntime can run one) and its feeds: one
    batch of ``--records`` calibration records, or one feed per record where the graph fixes the batch."""
    import logging

    import onnxruntime as ort
    import real_model_backend as real

    logging.getLogger().setLevel(logging.ERROR)
    folder = args.model.parent
    data = next(p for p in (folder / n for n in ("calib.h5", "calib.npz", "calib")) if p.exists())
    feeds = real._batch(data, args.model, args.records)
    probe = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    model = args.model
    if any(i.shape[0] == 1 for i in probe.get_inputs()):
        cache = Path(tempfile.gettempdir()) / f"qaccuracy-backend-cpu-{folder.name}"
        cache.mkdir(exist_ok=True)
        model = real._free_batch(args.model, cache) or args.model
    if model == args.model and any(i.shape[0] == 1 for i in probe.get_inputs()):
        return model, [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(args.records)]
    return model, [feeds]


def _child(args: argparse.Namespace) -> None:
    from pytest_qaccuracy.backend import IntegerSession, interpreter

    if args.model:
        path, feeds = _corpus(args)
    else:
        path, batch = _model(args)
        feeds = [{"input": batch}]
    for assignment in filter(None, os.environ.get("BENCH_SET", "").split(";")):  # module.NAME=int
        target, value = assignment.split("=", 1)
        module, name = target.rsplit(".", 1)
        setattr(importlib.import_module(module), name, int(value))
    session = IntegerSession(path, os.environ.get("BENCH_PRESET", args.preset), threads=args.threads)
    outputs = [session.run(None, f) for f in feeds]  # warm: tables, weights, scratch
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for out in outputs for o in out))
    steps: dict[str, float] = {}
    if args.steps:
        execute = interpreter.IntegerSession._execute

        def timed(self, plan, values, last_use, on_tensor):  # each step's CPU time, summed over the feeds
            for index, bound in enumerate(plan):
                start = time.process_time()
                execute(self, [bound], values, {0: last_use.get(index, [])}, on_tensor)
                key = f"{bound.step.op_type} {bound.step.name}"
                steps[key] = steps.get(key, 0.0) + time.process_time() - start

        interpreter.IntegerSession._execute = timed
    times, walls, per_step = [], [], []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.repeat):
        steps.clear()
        start, wall = time.process_time(), time.perf_counter()
        for f in feeds:
            session.run(None, f)
        times.append(time.process_time() - start)
        walls.append(time.perf_counter() - wall)
        per_step.append(dict(steps))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    best = {k: min(run[k] for run in per_step) for k in per_step[0]} if args.steps else {}
    print(
        json.dumps(
            {
                "times": times,
                "walls": walls,
                "rss": usage.ru_maxrss,
                "faults": (usage.ru_minflt - faults) / args.repeat,
                "digest": digest.hexdigest()[:12],
                "steps": best,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=("plain", "detector", "mobile"), default="plain")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", type=Path, default=None, help="a corpus model instead of a bench net")
    parser.add_argument("--records", type=int, default=8, help="calibration records of --model")
    parser.add_argument("--threads", type=int, default=1, help="the session's intra-op threads")
    parser.add_argument("--steps", type=int, default=0, help="print the K steps that differ most")
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
    if args.model is None:
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
    what = (
        f"{args.model} ({args.records} records)"
        if args.model
        else f"{args.net} {args.size}x{args.size}, {args.format}, batch {args.batch}"
    )
    print(f"{what}, preset {args.preset}, {args.threads} thread(s)")
    print(
        "\n| setting | best CPU ms | median CPU ms | best / median wall ms | peak RSS MB | faults per run | outputs |"
    )
    print("|---|---|---|---|---|---|---|")
    for setting, runs in seen.items():
        times = [t for run in runs for t in run["times"]]
        walls = [t for run in runs for t in run["walls"]]
        rss = max(run["rss"] for run in runs) / 1024
        faults = statistics.median(run["faults"] for run in runs)
        digests = ",".join(sorted({run["digest"] for run in runs}))
        print(
            f"| {setting or 'default'} | {min(times) * 1000:.1f} | {statistics.median(times) * 1000:.1f} "
            f"| {min(walls) * 1000:.1f} / {statistics.median(walls) * 1000:.1f} | {rss:.0f} | {faults:.0f} "
            f"| {digests} |"
        )
    if args.steps:
        names = list(seen)
        best = {s: {k: min(run["steps"][k] for run in runs) for k in runs[0]["steps"]} for s, runs in seen.items()}
        keys = sorted(best[names[0]], key=lambda k: -max(abs(best[s].get(k, 0) - best[names[0]][k]) for s in names))
        totals = " | ".join(f"{sum(best[s].values()) * 1000:.1f}" for s in names)
        print("\nthe steps' best CPU times summed (less noisy than a run's best): " + totals)
        print("\n| step (best CPU ms) | " + " | ".join(s or "default" for s in names) + " |")
        print("|---|" + "---|" * len(names))
        for key in keys[: args.steps]:
            print(f"| {key} | " + " | ".join(f"{best[s].get(key, float('nan')) * 1000:.2f}" for s in names) + " |")


if __name__ == "__main__":
    main()
