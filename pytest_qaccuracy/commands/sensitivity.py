"""``qaccuracy sensitivity``: which quantized nodes hurt the outputs, and what to keep in float."""

from __future__ import annotations

import argparse
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
    names,
    runtime_options,
)
from pytest_qaccuracy.errors import InputError

NAME = "sensitivity"
HELP = "rank the quantized nodes of a QDQ model by how much they hurt the outputs; suggest nodes to exclude"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fp32", type=Path, help="the fp32 ONNX model")
    parser.add_argument("quantized", type=Path, help="the QDQ ONNX model")
    add_data(parser)
    parser.add_argument(
        "--mode",
        choices=("single", "leave-one-out", "cumulative"),
        default="single",
        help="single: only the node quantized; leave-one-out: all but the node; cumulative: error per layer",
    )
    parser.add_argument(
        "--metrics",
        default="cosine",
        metavar="LIST",
        help="comma-separated metric names; the first ranks (default: cosine; compare measures all, "
        "which here would cost every metric per node)",
    )
    parser.add_argument(
        "--granularity",
        choices=("node", "weight", "activation"),
        default="node",
        help="what one experiment quantizes: a whole node, or only its weights or its activations",
    )
    parser.add_argument("--nodes", type=names, default=None, help="comma-separated nodes to analyse (default: all)")
    parser.add_argument(
        "--output",
        type=names,
        default=None,
        metavar="NAMES",
        help="measure at these comma-separated fp32 tensors or nodes instead of the model outputs "
        "(Horizon's output_node); only the nodes before them are analysed",
    )
    parser.add_argument("--sweep", type=int, default=None, metavar="K", help="keep the K worst nodes in float, k=0..K")
    parser.add_argument("--target", default=None, help="suggest the nodes to exclude to reach e.g. cosine>=0.999")
    parser.add_argument(
        "--quantize-nodes",
        type=names,
        action="append",
        default=[],
        metavar="LIST",
        help="cumulative: a curve quantizing only these (repeatable: one curve each)",
    )
    parser.add_argument(
        "--exclude-nodes",
        type=names,
        action="append",
        default=[],
        metavar="LIST",
        help="cumulative: a curve with all but these nodes quantized (repeatable: one curve each)",
    )
    parser.add_argument("--average-mode", action="store_true", help="cumulative: running mean of the curve")
    parser.add_argument(
        "--records", type=int, default=None, metavar="N", help="analyse the first N records only (default: all)"
    )
    add_batch_size(parser)
    add_threads(parser)
    add_providers(parser)
    add_quiet(parser)
    parser.add_argument(
        "--capture",
        choices=("reference", "deployed"),
        default="reference",
        help="reference: QDQ fake-quant semantics, so a partial model means what the whole one does "
        "(the default here; compare defaults to deployed); deployed: onnxruntime's fused kernels",
    )
    parser.add_argument(
        "--strategy",
        choices=("reuse", "naive"),
        default="reuse",
        help="reuse: run only what a node changes; naive: one partial model per node (same numbers)",
    )
    parser.add_argument("--allow-nonfinite", action="store_true", help="accept NaN/Inf in the inputs")
    add_top(parser, "nodes")
    add_json(parser, "the results")
    add_out_dir(parser, "result files and chart data")


def run(args: argparse.Namespace) -> int:
    from pytest_qaccuracy.analysis.cumulative import DEFAULT_CONFIGS, cumulative_in, parse_configs
    from pytest_qaccuracy.analysis.sensitivity import open_session, sensitivity_in
    from pytest_qaccuracy.analysis.sweep import Target, sweep_in
    from pytest_qaccuracy.atomic import check_file_target
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.report.artifacts import artifact_stem
    from pytest_qaccuracy.report.publish import check_out_dir
    from pytest_qaccuracy.report.sensitivity_tables import (
        cumulative_table,
        sensitivity_table,
        sweep_table,
        write_sensitivity_artifacts,
    )

    if args.records is not None and args.records < 1:
        raise InputError(f"--records must be >= 1, got {args.records}")
    if args.sweep is not None and args.sweep < 0:
        raise InputError(f"--sweep must be >= 0, got {args.sweep}")
    if args.mode == "cumulative" and (args.sweep is not None or args.target):
        raise InputError("--sweep and --target apply to --mode single or leave-one-out, not cumulative")
    if args.mode != "cumulative" and (args.quantize_nodes or args.exclude_nodes or args.average_mode):
        raise InputError("--quantize-nodes, --exclude-nodes and --average-mode apply to --mode cumulative")
    target = Target.parse(args.target) if args.target else None
    options = runtime_options(args)
    metrics = list(names(args.metrics))
    if target is not None and target.metric not in metrics:
        metrics.append(target.metric)
    if args.json is not None:
        check_file_target(args.json, "--json")
    if args.out_dir is not None:
        check_out_dir(args.out_dir, "--out-dir")
    pair = ModelPair(args.fp32, args.quantized)
    session = open_session(
        pair, args.data, metrics, options, args.capture, args.strategy, args.allow_nonfinite, args.records, args.output
    )
    results = {}
    try:
        if args.mode == "cumulative":
            configs = parse_configs(args.quantize_nodes, args.exclude_nodes) or list(DEFAULT_CONFIGS)
            results["cumulative"] = cumulative_in(session, configs, args.average_mode)
            sys.stdout.write(cumulative_table(results["cumulative"]) + "\n")
        else:
            ranking = sensitivity_in(session, args.mode, args.granularity, args.nodes)
            results["sensitivity"] = ranking
            sys.stdout.write(sensitivity_table(ranking, top=args.top) + "\n")
            if args.sweep is not None or target is not None:
                results["sweep"] = sweep_in(session, ranking, args.sweep, target)
                sys.stdout.write("\n" + sweep_table(results["sweep"]) + "\n")
    finally:
        session.close()
    stem = artifact_stem(pair.quantized_path.stem)  # the naming of qaccuracy compare's files
    for path in write_sensitivity_artifacts(stem, args.out_dir, args.json, **results):
        sys.stdout.write(f"wrote {path}\n")
    sweep = results.get("sweep")
    return 1 if sweep is not None and sweep.target is not None and sweep.suggestion is None else 0
