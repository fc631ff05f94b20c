"""``qaccuracy compare``: layer-wise error of a quantized model against its fp32 model."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from pytest_qaccuracy.tolerances import (
    DEFAULTS,
    GATE,
    SATURATION,
    TOLERANCES,
    Rule,
    Tolerance,
    ini_settings,
    parse_rules,
    tolerance_values,
)

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
    add_tolerances(parser)


#: Tolerances the command checks (the agreement gate and the saturation share are the plugin's).
CLI_TOLERANCES = tuple(name for name in TOLERANCES if name not in (GATE, SATURATION))


def add_tolerances(parser: argparse.ArgumentParser) -> None:
    """``--ini FILE``, ``--tolerance RULE`` and one flag per named tolerance: the plugin's tolerances,
    with its syntax and validation (:mod:`pytest_qaccuracy.tolerances`). Any of them makes the
    command a gate: exit 1 when a check fails."""
    group = parser.add_argument_group("tolerances (exit 1 when a check fails; docs/pytest.md)")
    group.add_argument(
        "--ini",
        type=Path,
        default=None,
        metavar="FILE",
        help="read qaccuracy_<tolerance> keys and qaccuracy_tolerances rules from a pytest.ini, tox.ini, "
        "setup.cfg or pyproject.toml",
    )
    group.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="RULE",
        help="a rule '<pair glob>[::<layer glob>] <metric><op><value>', e.g. '*::* sqnr>=12' (repeatable; "
        "after the --ini file's)",
    )
    group.add_argument("--name", default=None, help="the pair id rules match (default: the quantized model's stem)")
    for name in CLI_TOLERANCES:
        group.add_argument(f"--{name.replace('_', '-')}", default=None, metavar="X", help=TOLERANCES[name][1])


def read_tolerances(args: argparse.Namespace) -> tuple[dict[str, Tolerance], list[Rule]] | None:
    """The tolerances and rules asked for (flags win over the ``--ini`` file), or None: none asked for."""
    flags = {name: getattr(args, name) for name in CLI_TOLERANCES if getattr(args, name) is not None}
    if args.ini is None and not flags and not args.tolerance:
        return None
    try:
        tolerances, rules = ini_settings(args.ini) if args.ini is not None else (dict(DEFAULTS_AS_TOLERANCES), [])
        tolerances |= tolerance_values(flags, lambda name: f"command line --{name.replace('_', '-')}")
        rules += [
            replace(r, position=len(rules) + r.position)
            for r in parse_rules(args.tolerance, "command line --tolerance")
        ]
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return tolerances, rules


#: The plugin's defaults (``min_cosine = 0.99``), in effect whenever a tolerance is asked for.
DEFAULTS_AS_TOLERANCES = {name: Tolerance(name, value, "default") for name, value in DEFAULTS.items()}


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
    from pytest_qaccuracy.report.summary import summary_lines
    from pytest_qaccuracy.report.tables import comparison_table

    options = runtime_options(args, optimization=args.optimization, session_config=_session_config(args.session_config))
    stem = artifact_stem(args.quantized.stem)
    check_artifact_targets(args.json, args.out_dir, stem, parse_metric_names(args.metrics))
    asked = read_tolerances(args)  # before the models run: a bad tolerance is a usage error
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
    record = _record(args, pair, result, asked, options)
    sys.stdout.write(comparison_table(result, top=args.top, rank_by=rank_by) + "\n\n")
    if result.reduction and "fallback" in result.reduction:  # slower, same values: say why
        sys.stdout.write(f"note: layer sums computed in {result.reduction}\n")
    more_in = ", ".join(f for f, given in (("--json", args.json), ("--out-dir", args.out_dir)) if given) or "--json"
    lines = summary_lines([record], more_in=more_in, show_warnings=None)  # verdict, failed checks, every warning
    sys.stdout.write("\n".join(lines) + "\n")
    checks = record["checks"] if asked is not None else None
    write_comparison_artifacts(result, pair.fp32, json_path=args.json, out_dir=args.out_dir, checks=checks)
    if args.json is not None:
        sys.stdout.write(f"wrote {args.json}\n")
    if args.out_dir is not None:
        sys.stdout.write(
            f"wrote {len(result.metric_names)} visq.json and DOT files, and report.html, to {args.out_dir}\n"
        )
    return 0 if all(check["passed"] for check in record["checks"]) else 1


def _record(args: argparse.Namespace, pair: Any, result: Any, asked: Any, options: Any) -> dict[str, Any]:
    """The comparison as the plugin's pair record (``id``, ``comparison``, ``checks``, ``topk``): the
    summary, the JSON and the report read it as they read a pytest pair's."""
    from pytest_qaccuracy.analysis.checks import evaluate

    name = args.name or args.quantized.stem
    checks: list[dict[str, Any]] = []
    topk: dict[str, Any] = {}
    if asked is not None:
        tolerances, rules = asked
        stats = _output_stats(args, pair, tolerances, options)
        topk = dict(stats.topk) if stats is not None else {}
        checks = [{**o.to_dict(), "xfail": None} for o in evaluate(result, stats, tolerances, rules, name)]
    return {
        "id": name,
        "comparison": result.to_dict(),
        "checks": checks,
        "topk": topk,
        "backend": args.backend,
        "scheme": result.scheme or "onnxruntime",
    }


#: Tolerances that need a pass over the outputs of their own (element-wise bounds, top-k counts).
OUTPUT_PASS = ("rtol", "atol", "min_top1_agreement", "max_top1_drop")


def _output_stats(args: argparse.Namespace, pair: Any, tolerances: Mapping[str, Tolerance], options: Any) -> Any:
    """The output statistics the tolerances need (rtol/atol, top-k), or None when none does."""
    if not any(name in tolerances for name in OUTPUT_PASS):
        return None
    from pytest_qaccuracy.analysis.outputs import measure_outputs

    k = int(tolerances["topk"].value or 1) if "topk" in tolerances else 1
    rtol = tolerances["rtol"].value if "rtol" in tolerances else None
    atol = tolerances["atol"].value if "atol" in tolerances else None
    return measure_outputs(pair, args.data, sorted({1, k}), None, rtol, atol, options, args.backend, args.scheme)
