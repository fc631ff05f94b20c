"""``qaccuracy calibrate``: choose activation ranges on a dataset and write a QDQ model (contract 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "calibrate"
HELP = "calibrate an fp32 model on a dataset (minmax, ONE moving average/percentile, KL, MSE) and write a QDQ model"


def _pair(text: str) -> tuple[float, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two comma-separated numbers, got {text!r}")
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pytest_qaccuracy.analysis.calibration.calibrator import METHODS

    parser.add_argument("fp32", type=Path, help="the fp32 ONNX model")
    parser.add_argument("--data", required=True, type=Path, help=".h5/.hdf5 (ONE layout), .npz, or a folder of .npy")
    parser.add_argument("--method", choices=METHODS, default="minmax", help="how activation ranges are chosen")
    parser.add_argument("--power2", action="store_true", help="round every scale up to a power of two")
    parser.add_argument("--per-channel", action="store_true", help="quantize weights per output channel")
    parser.add_argument("--out", required=True, type=Path, help="the QDQ model to write")
    parser.add_argument("--activation-type", choices=("uint8", "int8"), default="uint8")
    parser.add_argument("--weight-type", choices=("uint8", "int8"), default="int8")
    parser.add_argument("--percentiles", type=_pair, default=(1.0, 99.0), metavar="MIN,MAX", help="ONE: 1,99")
    parser.add_argument("--moving-average", type=_pair, default=(16, 0.1), metavar="BATCH,CONST", help="ONE: 16,0.1")
    parser.add_argument("--bins", type=int, default=None, help="histogram bins, odd (kl: 8001, mse: 2047)")
    parser.add_argument("--exclude", default="", help="comma-separated nodes to keep in float (nodes_to_exclude)")
    parser.add_argument("--batch-size", type=int, default=8, help="records per run (default: 8)")
    parser.add_argument("--ranges-json", type=Path, default=None, help="also write the chosen ranges as JSON")


def run(args: argparse.Namespace) -> int:
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.report.atomic import atomic_write_json
    from pytest_qaccuracy.runtime import RuntimeOptions

    batch, constant = args.moving_average
    if batch != int(batch):
        raise InputError(f"--moving-average batch must be an integer, got {batch}")
    calibration = CalibrationOptions(
        method=args.method,
        activation_type=args.activation_type,
        weight_type=args.weight_type,
        per_channel=args.per_channel,
        power2=args.power2,
        percentiles=args.percentiles,
        moving_average=(int(batch), constant),
        bins=args.bins,
    )
    result = compute_ranges(args.fp32, args.data, calibration, RuntimeOptions(batch_size=args.batch_size))
    exclude = [n.strip() for n in args.exclude.split(",") if n.strip()]
    path = quantize_with_ranges(args.fp32, args.out, result, calibration, exclude)
    sys.stdout.write(f"calibrated {len(result.ranges)} tensor(s) on {result.records} record(s) with {args.method}\n")
    if args.ranges_json is not None:
        sys.stdout.write(f"wrote {atomic_write_json(args.ranges_json, result.to_dict())}\n")
    sys.stdout.write(f"wrote {path}\n")
    return 0
