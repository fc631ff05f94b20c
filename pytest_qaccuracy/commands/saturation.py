"""``qaccuracy saturation``: where a model's int16 pair sums overflow, per layer: they saturate on x86
CPUs without VNNI (u8 x s8) and wrap around on ARM64 (int8 weights of -128).

    qaccuracy saturation QUANT --data DATA [--preset PRESET] [--json OUT.json] [--max-saturated FRACTION]

Runs the model on the integer backend with ``--preset`` (``onnxruntime-avx2``, the default;
``onnxruntime-arm64-neon``, ``onnxruntime-arm64``) and with the same preset summing exactly, and prints,
per node, the pair sums it computed, how many overflowed, the record with the most, and how far its
8-bit output moved from the exact run; then the outputs' SQNR against the exact run, and the
remedies (docs/cpus.md). Exit 1 when the share of overflowing pair sums exceeds ``--max-saturated``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_qaccuracy.commands._options import add_batch_size, add_data, add_json, add_threads, check_counts

NAME = "saturation"
HELP = "count the int16 pair sums that saturate (x86 without VNNI) or wrap (ARM64), per layer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the quantized ONNX model (QDQ or QOperator)")
    add_data(parser)
    add_batch_size(parser)
    add_threads(parser)
    add_json(parser, "the report")
    parser.add_argument(
        "--preset",
        default="onnxruntime-avx2",
        help="where pair sums overflow: onnxruntime-avx2 (default; saturate), onnxruntime-arm64-neon or "
        "onnxruntime-arm64 (wrap); compared with the same preset summing exactly",
    )
    parser.add_argument(
        "--max-saturated",
        type=float,
        default=None,
        help="exit 1 when more than this fraction of pair sums overflows (e.g. 0)",
    )


def run(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from pytest_qaccuracy.analysis.saturation import check_remedies, exact_counterpart, measure_saturation
    from pytest_qaccuracy.atomic import atomic_write_json, check_file_target, write_errors
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.report.tables import shorten

    check_counts(args)
    if args.json is not None:
        check_file_target(args.json, "--json")
    if args.max_saturated is not None and not 0.0 <= args.max_saturated <= 1.0:
        raise InputError(f"--max-saturated must be a fraction between 0 and 1, got {args.max_saturated}")
    exact_counterpart(args.preset)  # an unknown preset fails before the model runs
    report = measure_saturation(
        args.model, args.data, batch_size=args.batch_size, threads=args.threads, preset=args.preset
    )
    done = "saturated" if report.effect == "saturate" else "wrapped"
    print(f"{report.model}: {report.records} records, {report.preset} (int16 pairs) against {report.exact}")
    if not report.layers:
        print(f"no layer sums 8-bit products in int16 pairs on {report.preset}")
    else:
        rows = [
            [
                shorten(layer.node),
                f"{layer.saturated} / {layer.pairs}",
                f"{100 * layer.share:.3g}%",
                "-" if layer.worst_record is None else f"{layer.worst_record} ({layer.worst_record_saturated})",
                "-" if layer.tensor is None else f"{layer.differing} / {layer.elements}",
                "-" if layer.tensor is None else str(layer.max_steps),
            ]
            for layer in report.layers
        ]
        headers = ["node", f"{done} pair sums", "share", "worst record", "output elements moved", "max steps"]
        print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
        print(f"total: {report.saturated} / {report.pairs} pair sums {report.effect} ({100 * report.share:.3g}%)")
    for name, sqnr in report.outputs.items():
        shown = "identical to the exact run" if sqnr is None else f"SQNR {sqnr:.4g} dB against the exact run"
        print(f"output '{name}' on {report.preset}: {shown}")
    document = report.to_dict()
    if report.saturated:
        remedies = check_remedies(args.model, args.data, report, batch_size=args.batch_size, threads=args.threads)
        print(f"remedies, each applied to the model and run on {report.preset} (docs/cpus.md):")
        rows = [
            [
                r.name,
                r.how,
                "-" if r.saturated is None else str(r.saturated),
                r.note or ", ".join(_sqnr_text(v) for v in r.outputs.values()),
            ]
            for r in remedies
        ]
        headers = ["remedy", "how", done, f"outputs against {report.exact}"]
        print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
        document["remedies"] = [
            {"name": r.name, "how": r.how, "saturated": r.saturated, "outputs_sqnr_vs_exact": r.outputs, "note": r.note}
            for r in remedies
        ]
    if args.json is not None:
        with write_errors("--json", args.json):
            atomic_write_json(args.json, document)
    if args.max_saturated is not None and report.share > args.max_saturated:
        sys.stderr.write(
            f"error: {100 * report.share:.3g}% of pair sums {report.effect} on {report.preset}, more than "
            f"--max-saturated {args.max_saturated:g}\n"
        )
        return 1
    return 0


def _sqnr_text(value: float | None) -> str:
    return "identical" if value is None else f"SQNR {value:.4g} dB"
