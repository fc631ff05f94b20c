"""Calibration time and peak RSS: our methods against onnxruntime's own Entropy calibration.

    python bench/calibration.py [--records 32] [--size 128] [--methods minmax,percentile,kl,mse,auto,ort-entropy]

Each method runs in a fresh process (peak RSS is per process): build the model once, write the
records as a ``.npz``, then calibrate and write the QDQ model. ``ort-entropy`` is
``quantize_static(..., calibrate_method=CalibrationMethod.Entropy)`` on the same model and records.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _one(method: str, model: Path, data: Path, out: Path) -> dict[str, float]:
    start = time.perf_counter()
    if method == "ort-entropy":
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

        from pytest_qaccuracy.analysis.calibration.reader import DatasetReader

        quantize_static(
            str(model),
            str(out),
            DatasetReader(data, model),
            quant_format=QuantFormat.QDQ,
            calibrate_method=CalibrationMethod.Entropy,
        )
    else:
        from pytest_qaccuracy.analysis.calibration import CalibrationOptions, calibrate

        calibrate(model, data, out, CalibrationOptions(method=method))
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # CPU seconds of every thread, since the process started: comparable under another process's load
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--methods", default="minmax,percentile,mse,kl,auto,ort-entropy")
    parser.add_argument("--one", nargs=4, metavar=("METHOD", "MODEL", "DATA", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, model, data, out = args.one
        print(json.dumps(_one(method, Path(model), Path(data), Path(out))))
        return
    from netzoo import images, mobile_detector

    with tempfile.TemporaryDirectory() as tmp:
        model = mobile_detector(Path(tmp) / "model.onnx", size=args.size)
        data = Path(tmp) / "data.npz"
        np.savez(data, x=images(args.records, size=args.size)[:, 0])
        print(f"mobile_detector {args.size}x{args.size}, {args.records} records")
        for method in args.methods.split(","):
            out = Path(tmp) / f"{method}.onnx"
            run = [sys.executable, __file__, "--one", method, str(model), str(data), str(out)]
            stdout = subprocess.run(run, capture_output=True, text=True, check=True).stdout
            figures = json.loads(stdout.splitlines()[-1])  # onnxruntime may print before the figures
            cpu, rss = figures["cpu_seconds"], figures["peak_rss_mb"]
            print(f"  {method:12s} {figures['seconds']:7.2f} s   cpu {cpu:7.2f} s   peak RSS {rss:7.0f} MB")


if __name__ == "__main__":
    main()
