"""``qaccuracy compare``: layer-wise error of a quantized model against its fp32 model."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
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
    task_spec,
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
    ini_task_metrics,
    parse_rules,
    parse_task_line,
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
        help="integer backend scheme preset, e.g. onnxruntime-avx2 for an x86 CPU without VNNI (docs/cpus.md), "
        "onnxruntime's pinned to the device's release with @MAJOR.MINOR (onnxruntime-arm64-neon@1.28); "
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
        help="read qaccuracy_<tolerance> keys, qaccuracy_tolerances rules, qaccuracy_task_metrics and "
        "qaccuracy_task_tolerances from a pytest.ini, tox.ini, setup.cfg or pyproject.toml",
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
    group.add_argument(
        "--task-metric",
        action="append",
        default=[],
        metavar="SPEC",
        help="a task metric to compute: module:Class, an entry point or a built-in (ctc, yolo_detection, "
        'binary_f1), or a JSON table {"metric": ..., options} (repeatable; after the --ini file\'s)',
    )
    group.add_argument(
        "--task-tolerance",
        action="append",
        default=[],
        metavar="LINE",
        help="a task-metric tolerance '<min|max|max_drop>:<value name> = <number>', e.g. 'max_drop:cer = 0.005' "
        "(repeatable; wins over the --ini file's line of the same name)",
    )
    group.add_argument(
        "--task-targets",
        type=Path,
        default=None,
        metavar="FILE",
        help="one task target per record, JSON lines (default: the data's targets, else its labels)",
    )
    for name in CLI_TOLERANCES:
        group.add_argument(f"--{name.replace('_', '-')}", default=None, metavar="X", help=TOLERANCES[name][1])


@dataclass(frozen=True)
class Asked:
    """What the command gates on: tolerances (task ones included), rules and task metrics."""

    tolerances: dict[str, Tolerance]
    rules: list[Rule]
    tasks: tuple[Any, ...] = ()


def read_tolerances(args: argparse.Namespace) -> Asked | None:
    """The tolerances, rules and task metrics asked for (flags win over the ``--ini`` file), or
    None: none asked for. Task metrics are imported and created once here: one that cannot be is an
    ``InputError`` naming it, before any model runs."""
    flags = {name: getattr(args, name) for name in CLI_TOLERANCES if getattr(args, name) is not None}
    tasks_given = args.task_metric or args.task_tolerance
    if args.ini is None and not flags and not args.tolerance and not tasks_given:
        return None
    try:
        tolerances, rules = ini_settings(args.ini) if args.ini is not None else (dict(DEFAULTS_AS_TOLERANCES), [])
        tolerances |= tolerance_values(flags, lambda name: f"command line --{name.replace('_', '-')}")
        for line in args.task_tolerance:
            name, value = parse_task_line(line)
            tolerances[name] = Tolerance(name, value, "command line --task-tolerance")
        rules += [
            replace(r, position=len(rules) + r.position)
            for r in parse_rules(args.tolerance, "command line --tolerance")
        ]
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return Asked(tolerances, rules, _task_specs(args))


def _task_specs(args: argparse.Namespace) -> tuple[Any, ...]:
    """``qaccuracy_task_metrics`` of the ``--ini`` file (its modules looked for beside it, as the
    plugin's ``pythonpath = .``), then ``--task-metric`` (from the working folder); each checked, or
    InputError with one line naming where it came from."""
    from pytest_qaccuracy.metrics.task import TaskSpec, parse_task_specs

    given: list[tuple[str, Any, Path]] = []
    if args.ini is not None:
        try:
            named = ini_task_metrics(args.ini)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        given += [(f"{args.ini}: qaccuracy_task_metrics", text, args.ini.resolve().parent) for text in named]
    given += [("--task-metric", task_spec(text), Path.cwd()) for text in args.task_metric]
    specs = []
    for where, value, folder in given:
        try:
            spec = TaskSpec.parse(value)
            spec = spec if spec.folder else replace(spec, folder=str(folder))
            parse_task_specs([spec])
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        specs.append(spec)
    try:
        return parse_task_specs(list(dict.fromkeys(specs)))
    except ValueError as exc:  # two metrics computing the same value name
        raise InputError(f"task metrics: {exc}") from None


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
    task: dict[str, Any] = {}
    if asked is not None:
        stats = _output_stats(args, pair, asked, options)
        topk = dict(stats.topk) if stats is not None else {}
        task = {k: v.to_dict() for k, v in stats.task.items()} if stats is not None else {}
        outcomes = evaluate(result, stats, asked.tolerances, asked.rules, name, whole=True)
        checks = [{**o.to_dict(), "xfail": None} for o in outcomes]
    return {
        "id": name,
        "comparison": result.to_dict(),
        "checks": checks,
        "topk": topk,
        "task": task,
        "backend": args.backend,
        "scheme": result.scheme or "onnxruntime",
    }


#: Tolerances that need a pass over the outputs of their own (element-wise bounds, top-k counts).
OUTPUT_PASS = ("rtol", "atol", "min_top1_agreement", "max_top1_drop")


def _output_stats(args: argparse.Namespace, pair: Any, asked: Asked, options: Any) -> Any:
    """The output statistics the tolerances need (rtol/atol, top-k) and the task metrics' values, in
    one pass over the outputs as deployed; None when nothing needs them. A task metric that raises
    fails the checks of its values only, as in the plugin."""
    tolerances = asked.tolerances
    if not asked.tasks and not any(name in tolerances for name in OUTPUT_PASS):
        return None
    from pytest_qaccuracy.analysis.outputs import measure_outputs

    targets = None
    if asked.tasks and args.task_targets is not None:
        from pytest_qaccuracy.data import load_dataset
        from pytest_qaccuracy.data.targets import read_sidecar

        with load_dataset(args.data) as dataset:
            targets = read_sidecar(args.task_targets, len(dataset))
    k = int(tolerances["topk"].value or 1) if "topk" in tolerances else 1
    rtol = tolerances["rtol"].value if "rtol" in tolerances else None
    atol = tolerances["atol"].value if "atol" in tolerances else None
    return measure_outputs(
        pair,
        args.data,
        sorted({1, k}),
        None,
        rtol,
        atol,
        options,
        args.backend,
        args.scheme,
        tasks=asked.tasks,
        targets=targets,
        keep_task_errors=True,
    )
