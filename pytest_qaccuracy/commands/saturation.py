"""``qaccuracy saturation``: where a u8 x s8 model's int16 pair sums saturate on x86 CPUs without VNNI.

    qaccuracy saturation QUANT --data DATA [--json OUT.json] [--max-saturated FRACTION]

Runs the model on the integer backend with ``onnxruntime-avx2`` and ``onnxruntime-vnni`` and prints,
per node, the pair sums it computed, how many saturated, the record with the most, and how far its
8-bit output moved from the exact run; then the outputs' SQNR against the exact run, and the
remedies (docs/cpus.md). Exit 1 when the share of saturated pair sums exceeds ``--max-saturated``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_qaccuracy.commands._options import add_batch_size, add_data, add_json, add_threads, check_counts

NAME = "saturation"
HELP = "count the int16 pair sums a u8 x s8 model saturates on x86 CPUs without VNNI, per layer"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the quantized ONNX model (QDQ or QOperator)")
    add_data(parser)
    add_batch_size(parser)
    add_threads(parser)
    add_json(parser, "the report")
    parser.add_argument(
        "--max-saturated",
        type=float,
        default=None,
        help="exit 1 when more than this fraction of pair sums saturates (e.g. 0)",
    )


def run(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from pytest_qaccuracy.analysis.saturation import EXACT, SATURATING, check_remedies, measure_saturation
    from pytest_qaccuracy.atomic import atomic_write_json, check_file_target, write_errors
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.report.tables import shorten

    check_counts(args)
    if args.json is not None:
        check_file_target(args.json, "--json")
    if args.max_saturated is not None and not 0.0 <= args.max_saturated <= 1.0:
        raise InputError(f"--max-saturated must be a fraction between 0 and 1, got {args.max_saturated}")
    report = measure_saturation(args.model, args.data, batch_size=args.batch_size, threads=args.threads)
    print(f"{report.model}: {report.records} records, {SATURATING} (int16 pairs) against {EXACT} (exact sums)")
    if not report.layers:
        print("no u8 x s8 layer sums products in pairs: the model computes the same on every x86 CPU")
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
        headers = ["node", "saturated pair sums", "share", "worst record", "output elements moved", "max steps"]
        print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
        print(f"total: {report.saturated} / {report.pairs} pair sums saturate ({100 * report.share:.3g}%)")
    for name, sqnr in report.outputs.items():
        shown = "identical to the exact run" if sqnr is None else f"SQNR {sqnr:.4g} dB against the exact run"
        print(f"output '{name}' on {SATURATING}: {shown}")
    document = report.to_dict()
    if report.saturated:
        remedies = check_remedies(args.model, args.data, report, batch_size=args.batch_size, threads=args.threads)
        print(f"remedies, each applied to the model and run on {SATURATING} (docs/cpus.md):")
        rows = [
            [
                r.name,
                r.how,
                "-" if r.saturated is None else str(r.saturated),
                r.note or ", ".join(_sqnr_text(v) for v in r.outputs.values()),
            ]
            for r in remedies
        ]
        headers = ["remedy", "how", "saturated", f"outputs against {EXACT}"]
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
            f"error: {100 * report.share:.3g}% of pair sums saturate on {SATURATING}, more than "
            f"--max-saturated {args.max_saturated:g}\n"
        )
        return 1
    return 0


def _sqnr_text(value: float | None) -> str:
    return "identical" if value is None else f"SQNR {value:.4g} dB"
