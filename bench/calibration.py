"""Calibration time and peak RSS: our methods against onnxruntime's own Entropy calibration.

    python bench/calibration.py [--records 32] [--size 128] [--methods minmax,percentile,kl,mse,auto,ort-entropy]
    python bench/calibration.py --one METHOD MODEL DATA OUT [--recipe u8s8|s8s8_pc]

Each method runs in a fresh process (peak RSS is per process): build the model once, write the
records as a ``.npz``, then calibrate and write the QDQ model. ``ort-entropy`` is
``quantize_static(..., calibrate_method=CalibrationMethod.Entropy)`` on the same model and records.
``--recipe s8s8_pc`` (with ``--one``): int8 activations and per-channel weights for both, the model
converted to opset 13 first if older (outside the timing, for both).
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


def _one(method: str, model: Path, data: Path, out: Path, recipe: str = "u8s8") -> dict[str, float]:
    import onnx

    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, calibrate
    from pytest_qaccuracy.analysis.calibration.quantize import with_opset_for

    s8 = recipe == "s8s8_pc"
    kind = "minmax" if method.startswith("ort-") else method
    options = CalibrationOptions(method=kind, activation_type="int8" if s8 else "uint8", per_channel=s8)
    proto, converted = with_opset_for(onnx.load(str(model)), options)
    if converted:
        model = out.with_suffix(".opset13.onnx")
        onnx.save(proto, str(model))
    start = time.perf_counter()
    if method == "ort-entropy":
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        from pytest_qaccuracy.analysis.calibration.reader import DatasetReader

        quantize_static(
            str(model),
            str(out),
            DatasetReader(data, model),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8 if s8 else QuantType.QUInt8,
            per_channel=s8,
            calibrate_method=CalibrationMethod.Entropy,
        )
    else:
        calibrate(model, data, out, options)
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
    parser.add_argument("--recipe", choices=("u8s8", "s8s8_pc"), default="u8s8", help="with --one")
    args = parser.parse_args()
    if args.one:
        method, model, data, out = args.one
        print(json.dumps(_one(method, Path(model), Path(data), Path(out), args.recipe)))
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
