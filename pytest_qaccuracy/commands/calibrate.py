"""``qaccuracy calibrate``: choose activation ranges on a dataset and write a QDQ model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_qaccuracy.commands._options import (
    add_batch_size,
    add_data,
    add_json,
    add_providers,
    add_quiet,
    add_threads,
    names,
    runtime_options,
)

NAME = "calibrate"
HELP = (
    "calibrate an fp32 model on a dataset (auto: each range chosen by its measured effect; minmax, ONE moving "
    "average/percentile, KL, MSE) and write a QDQ model"
)


def _pair(text: str) -> tuple[float, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two comma-separated numbers, got {text!r}")
    try:
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pytest_qaccuracy.analysis.calibration.options import METHODS

    parser.add_argument("fp32", type=Path, help="the fp32 ONNX model")
    add_data(parser)
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="minmax",
        help="how activation ranges are chosen; auto (recommended) measures every method's range of every tensor",
    )
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip the check that the model is no worse at the outputs than min/max (one more pass over the data)",
    )
    parser.add_argument("--power2", action="store_true", help="round every scale up to a power of two")
    parser.add_argument("--per-channel", action="store_true", help="quantize weights per output channel")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE", help="the QDQ model to write")
    parser.add_argument(
        "--format",
        dest="quant_format",
        choices=("qdq", "qoperator"),
        default="qdq",
        help="the model onnxruntime writes: QDQ pairs or QOperator (QLinearConv, ...)",
    )
    parser.add_argument("--activation-type", choices=("uint8", "int8"), default="uint8", help="activation integer type")
    parser.add_argument("--weight-type", choices=("uint8", "int8"), default="int8", help="weight integer type")
    parser.add_argument(
        "--percentiles",
        type=_pair,
        default=(1.0, 99.0),
        metavar="MIN,MAX",
        help="percentile method: the percentiles kept, as ONE's 1,99",
    )
    parser.add_argument(
        "--moving-average",
        type=_pair,
        default=(16, 0.1),
        metavar="BATCH,CONST",
        help="moving-average method: batch and constant, as ONE's 16,0.1",
    )
    parser.add_argument("--bins", type=int, default=None, help="histogram bins, odd (default: kl 8001, mse 2047)")
    parser.add_argument(
        "--exclude-nodes",
        type=names,
        action="append",
        default=[],
        metavar="LIST",
        help="comma-separated nodes to keep in float (onnxruntime's nodes_to_exclude; repeatable, adds)",
    )
    add_batch_size(parser)
    add_threads(parser)
    add_providers(parser)
    add_quiet(parser)
    add_json(parser, "the chosen ranges")


def run(args: argparse.Namespace) -> int:
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges
    from pytest_qaccuracy.analysis.calibration.auto import check_against_minmax, selection_line
    from pytest_qaccuracy.analysis.calibration.quantize import opset_note
    from pytest_qaccuracy.atomic import atomic_write_json, check_file_target, write_errors
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.model.loading import load_model

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
        quant_format=args.quant_format,
    )
    options = runtime_options(args)
    if args.json is not None:
        check_file_target(args.json, "--json")
    exclude = [node for group in args.exclude_nodes for node in group]
    result = compute_ranges(args.fp32, args.data, calibration, options, nodes_to_exclude=exclude)
    with write_errors("--out", args.out):
        path = quantize_with_ranges(args.fp32, args.out, result, calibration, exclude)
    sys.stdout.write(f"calibrated {len(result.ranges)} tensor(s) on {result.records} record(s) with {args.method}\n")
    note = opset_note(load_model(args.fp32), calibration)
    if note:
        sys.stdout.write(f"{note}\n")
    if result.selection is not None:
        sys.stdout.write(f"{selection_line(result.selection)}\n")
    elif args.check and args.method != "minmax":
        warning = check_against_minmax(args.fp32, path, result, args.data, calibration, options, exclude)
        if warning:
            sys.stderr.write(f"warning: {warning}\n")
    if args.json is not None:
        with write_errors("--json", args.json):
            sys.stdout.write(f"wrote {atomic_write_json(args.json, result.to_dict())}\n")
    sys.stdout.write(f"wrote {path}\n")
    return 0
