"""``qaccuracy recipe``: search a quantization recipe that meets a target, verified with onnxruntime."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from pytest_qaccuracy.commands._options import (
    add_batch_size,
    add_json,
    add_providers,
    add_quiet,
    add_threads,
    names,
    runtime_options,
    task_spec,
)

NAME = "recipe"
HELP = (
    "search quantize_static arguments (calibration, per-channel, 7-bit weights, types, 16-bit and float nodes) "
    "that meet a target on held-out records on every deployment target"
)
#: Exit code when Ctrl-C stopped the search (the best recipe so far is written, if one was measured).
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fp32", type=Path, help="the fp32 ONNX model")
    parser.add_argument(
        "--data", required=True, type=Path, help="calibration records: .h5/.hdf5, .npz, or a folder of .npy"
    )
    parser.add_argument(
        "--eval", required=True, type=Path, help="held-out evaluation records every recipe is measured on"
    )
    parser.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="CHECK",
        help="what the recipe must meet: an output metric (cosine>=0.99, sqnr>=20), rtol<=X / atol<=X, "
        "max_top1_drop<=X (needs labels), min_top1_agreement>=X, or a task value (max_drop:cer<=0.01, "
        "min:exact_match>=0.9; with --task-metric); repeatable: all must hold",
    )
    parser.add_argument(
        "--task-metric",
        action="append",
        default=[],
        metavar="SPEC",
        help="a task metric the task targets read: module:Class, an entry point or a built-in (ctc, "
        'yolo_detection, binary_f1), or a JSON table {"metric": ..., options} (repeatable)',
    )
    parser.add_argument(
        "--task-targets",
        type=Path,
        default=None,
        metavar="FILE",
        help="one task target per --eval record, JSON lines (default: the data's targets, else its labels)",
    )
    parser.add_argument(
        "--targets",
        type=names,
        default=("onnxruntime",),
        metavar="LIST",
        help="deployment targets: onnxruntime (this host's session) and integer-backend presets such as "
        "onnxruntime-avx2,onnxruntime-vnni (onnxruntime's may name the device's release: onnxruntime-arm64@1.28)",
    )
    parser.add_argument(
        "--budget",
        default="",
        metavar="LIMIT",
        help="stop after a time (90s, 10m, 1h) or experiments (40); both: 10m,40 (default: unbounded)",
    )
    parser.add_argument("--out-dir", type=Path, required=True, metavar="DIR", help="write the recipe's files to DIR")
    parser.add_argument(
        "--methods", type=names, default=None, metavar="LIST", help="calibration methods to try (default: all)"
    )
    parser.add_argument("--method", default="minmax", help="the starting recipe's calibration method")
    parser.add_argument("--per-channel", action="store_true", help="start from per-channel weights")
    parser.add_argument("--reduce-range", action="store_true", help="start from 7-bit weights")
    parser.add_argument("--activation-type", choices=("uint8", "int8"), default="uint8", help="start activation type")
    parser.add_argument("--weight-type", choices=("uint8", "int8"), default="int8", help="start weight type")
    parser.add_argument(
        "--cost",
        default="int16=1,float=1",
        metavar="WEIGHTS",
        help="cost per MAC of 16-bit and float nodes (default: equal, as on onnxruntime's CPU provider; "
        "int16=0.5 for accelerators with 16-bit units)",
    )
    parser.add_argument(
        "--estimate-records",
        type=int,
        default=4,
        metavar="N",
        help="how many --eval records (the first) the node estimates run on",
    )
    parser.add_argument(
        "--exhaustive-nodes",
        type=int,
        default=16,
        metavar="N",
        help="with at most N candidate nodes, try every assignment in order of cost (optimal)",
    )
    add_batch_size(parser)
    add_threads(parser)
    add_providers(parser)
    add_quiet(parser)
    add_json(parser, "the search (every step)")


def run(args: argparse.Namespace) -> int:
    from pytest_qaccuracy.analysis.recipe import Budget, Recipe, check_targets, parse_checks, search_recipe
    from pytest_qaccuracy.analysis.recipe.build import check_onnxruntime
    from pytest_qaccuracy.analysis.recipe.cost import parse_weights
    from pytest_qaccuracy.analysis.recipe.search import held_out
    from pytest_qaccuracy.atomic import atomic_write_json, check_dir_target, check_file_target
    from pytest_qaccuracy.data.progress import Heartbeat
    from pytest_qaccuracy.errors import InputError
    from pytest_qaccuracy.report.recipe_tables import step_line, steps_table, verdict_lines, write_recipe

    checks = parse_checks(args.target)
    targets = check_targets(args.targets)
    budget = Budget.parse(args.budget)
    weights = parse_weights(args.cost)
    for flag in ("estimate_records", "exhaustive_nodes"):
        if getattr(args, flag) < 0:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 0, got {getattr(args, flag)}")
    options = runtime_options(args)
    for path, flag in ((args.fp32, "FP32"), (args.data, "--data"), (args.eval, "--eval")):
        if not path.exists():
            raise InputError(f"{flag}: {path} does not exist")
    check_dir_target(args.out_dir, "--out-dir")
    if args.json is not None:
        check_file_target(args.json, "--json")
    tasks = [task_spec(text) for text in args.task_metric]
    if args.task_targets is not None and not args.task_targets.exists():
        raise InputError(f"--task-targets: {args.task_targets} does not exist")
    check_onnxruntime()  # its refusal is the one line, ahead of the warning below
    if not held_out(args.data, args.eval):
        sys.stderr.write(
            f"warning: --eval {args.eval} is the --data file: the evaluation records are the calibration "
            "records, not held out\n"
        )
    start = Recipe(args.method, args.per_channel, args.reduce_range, args.activation_type, args.weight_type)

    def write(text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    heartbeat = Heartbeat(write, "recipe")  # a log never silent for more than 30 s, even inside a step

    def on_step(step, best) -> None:
        if not args.quiet:
            heartbeat.say(step_line(step, best, checks))

    def on_note(text: str) -> None:
        if not args.quiet:
            heartbeat.say(f"recipe: {text}")

    with heartbeat if not args.quiet else contextlib.nullcontext():
        result = search_recipe(
            args.fp32,
            args.data,
            args.eval,
            checks,
            targets,
            start=start,
            budget=budget,
            weights=weights,
            methods=args.methods,
            options=options,
            estimate_records=args.estimate_records,
            exhaustive_nodes=args.exhaustive_nodes,
            on_step=on_step,
            on_note=on_note,
            model_out=args.out_dir / f"{args.fp32.stem}.recipe.onnx",
            tasks=tasks,
            task_targets=args.task_targets,
        )
    paths = write_recipe(result, args.out_dir, args.fp32, args.data) if result.best is not None else []
    if args.json is not None:
        paths.append(atomic_write_json(args.json, result.to_dict()))
    sys.stdout.write(steps_table(result) + "\n\n")
    sys.stdout.write("\n".join(verdict_lines(result)) + "\n")
    for path in paths:
        sys.stdout.write(f"wrote {path}\n")
    if result.stopped == "interrupted":
        if result.best is None:
            sys.stderr.write("error: interrupted before a recipe was measured; no recipe written\n")
        else:
            sys.stderr.write("error: interrupted; the best recipe so far is written\n")
        return EXIT_INTERRUPTED
    return 0 if result.met else 1
