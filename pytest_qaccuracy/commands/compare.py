"""``qaccuracy compare``: layer-wise error of a quantized model against its fp32 model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_qaccuracy.commands._options import (
    add_batch_size,
    add_data,
    add_json,
    add_out_dir,
    add_providers,
    add_quiet,
    add_threads,
    add_top,
    runtime_options,
)
from pytest_qaccuracy.errors import InputError

NAME = "compare"
HELP = "compare an fp32 model and its quantized version, layer by layer, on a dataset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fp32", type=Path, help="the fp32 ONNX model")
    parser.add_argument("quantized", type=Path, help="the quantized ONNX model (QDQ or QOperator)")
    add_data(parser)
    parser.add_argument("--metrics", default=None, metavar="LIST", help="comma-separated metric names (default: all)")
    add_batch_size(parser)
    parser.add_argument(
        "--backend",
        choices=("onnxruntime", "integer"),
        default="onnxruntime",
        help="where the quantized model runs (the plugin's qaccuracy_backend)",
    )
    parser.add_argument(
        "--scheme",
        default=None,
        help="integer backend scheme preset, e.g. onnxruntime-avx2 for an x86 CPU without VNNI (docs/cpus.md); "
        "with --backend integer only",
    )
    parser.add_argument(
        "--capture",
        choices=("deployed", "reference"),
        default="deployed",
        help="deployed: onnxruntime's fused kernels, what ships (the default here; sensitivity defaults to "
        "reference); reference: QDQ fake-quant semantics",
    )
    add_providers(parser)
    add_quiet(parser)
    parser.add_argument(
        "--optimization",
        choices=("disable", "basic", "extended", "all"),
        default="all",
        help="onnxruntime graph optimization level",
    )
    add_threads(parser)
    parser.add_argument(
        "--session-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="onnxruntime session config entry, e.g. session.qdqisint8allowed=1 (repeatable)",
    )
    parser.add_argument(
        "--map", type=Path, default=None, metavar="FILE", help="JSON file {fp32 tensor: quantized tensor}"
    )
    parser.add_argument("--allow-nonfinite", action="store_true", help="accept NaN/Inf in the inputs")
    parser.add_argument("--outputs-only", action="store_true", help="compare the model outputs only")
    add_json(parser, "the comparison")
    add_out_dir(parser, "visq.json and DOT files per metric, the comparison JSON and report.html")
    add_top(parser, "worst layers")
    parser.add_argument(
        "--rank-by", default=None, help="metric that ranks the worst layers (default: sqnr if measured)"
    )


def _session_config(items: list[str]) -> dict[str, str]:
    config = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--session-config expects KEY=VALUE, got {item!r}")
        config[key.strip()] = value.strip()
    return config


def _mapping(path: Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the tensor mapping ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise InputError(f"{path}: the tensor mapping must be a JSON object of strings {{fp32: quantized}}")
    return data


def run(args: argparse.Namespace) -> int:
    from pytest_qaccuracy.analysis.compare import compare
    from pytest_qaccuracy.metrics import parse_metric_names
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.report.artifacts import artifact_stem, check_artifact_targets, write_comparison_artifacts
    from pytest_qaccuracy.report.summary import channel_warnings
    from pytest_qaccuracy.report.tables import comparison_table

    options = runtime_options(args, optimization=args.optimization, session_config=_session_config(args.session_config))
    stem = artifact_stem(args.quantized.stem)
    check_artifact_targets(args.json, args.out_dir, stem, parse_metric_names(args.metrics))
    pair = ModelPair(args.fp32, args.quantized, mapping=_mapping(args.map))
    if args.scheme and args.backend != "integer":
        raise InputError("--scheme applies to --backend integer only")
    result = compare(
        pair,
        args.data,
        metrics=args.metrics,
        options=options,
        capture=args.capture,
        layers=not args.outputs_only,
        allow_nonfinite=args.allow_nonfinite,
        backend=args.backend,
        scheme=args.scheme,
    )
    rank_by = args.rank_by or ("sqnr" if "sqnr" in result.metric_names else None)
    if rank_by is not None and rank_by not in result.metric_names:
        raise InputError(f"--rank-by {rank_by}: not among the measured metrics {', '.join(result.metric_names)}")
    sys.stdout.write(comparison_table(result, top=args.top, rank_by=rank_by) + "\n")
    for text in channel_warnings(result.to_dict()):  # channels one scale loses
        sys.stdout.write(f"warning: {text}\n")
    if result.reduction and "fallback" in result.reduction:  # slower, same values: say why
        sys.stdout.write(f"note: layer sums computed in {result.reduction}\n")
    write_comparison_artifacts(result, pair.fp32, json_path=args.json, out_dir=args.out_dir)
    if args.json is not None:
        sys.stdout.write(f"wrote {args.json}\n")
    if args.out_dir is not None:
        sys.stdout.write(
            f"wrote {len(result.metric_names)} visq.json and DOT files, and report.html, to {args.out_dir}\n"
        )
    return 0
