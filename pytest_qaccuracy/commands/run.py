"""``qaccuracy run``: run a quantized model on a dataset and write its outputs.

    qaccuracy run QUANT --data DATA --backend integer --scheme PRESET --out OUT.h5

The outputs are written in the ONE HDF5 layout: ``value/<record>/<output index>``, one dataset per
graph output per record. The file is written to a temporary file in the same folder and renamed, so a
failed run never leaves a half-written file.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pytest_qaccuracy.errors import InputError, ModelError, QAccuracyError

if TYPE_CHECKING:
    import onnx

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]

NAME = "run"
HELP = "run a quantized model on a dataset (integer emulation or onnxruntime) and write its outputs as HDF5"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pytest_qaccuracy.commands._options import add_batch_size, add_data, add_quiet, add_threads

    parser.add_argument("model", type=Path, help="the quantized ONNX model (QDQ or QOperator)")
    add_data(parser)
    parser.add_argument(
        "--backend",
        choices=("integer", "onnxruntime"),
        default="integer",
        help="where the model runs (default: integer, the emulation this command exists for; compare "
        "defaults to onnxruntime)",
    )
    parser.add_argument(
        "--scheme",
        default="onnxruntime",
        help="integer backend scheme preset (docs/backend.md); onnxruntime's may end in @MAJOR.MINOR, the release",
    )
    parser.add_argument("--out", required=True, type=Path, metavar="FILE", help="output HDF5 file (ONE layout)")
    add_batch_size(parser)
    add_threads(parser)
    parser.add_argument("--allow-nonfinite", action="store_true", help="accept NaN/Inf in the inputs")
    add_quiet(parser)


def _runner(model: onnx.ModelProto, backend: str, scheme: str, threads: int) -> tuple[Runner, list[str], str | None]:
    """``(run(feeds) -> outputs, output names, scheme label)`` for the chosen backend."""
    if backend == "integer":
        from pytest_qaccuracy.backend import IntegerSession

        session = IntegerSession(model, scheme, threads=threads)
        names = [o.name for o in session.get_outputs()]
        return (lambda feeds: session.run(None, feeds)), names, session.scheme.name
    from pytest_qaccuracy.backend.agreement import onnxruntime_session
    from pytest_qaccuracy.ort_session import first_line

    names = [o.name for o in model.graph.output]
    ort_session = onnxruntime_session(model, [], threads)

    def run_ort(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return ort_session.run(None, feeds)
        except Exception as exc:  # onnxruntime's own errors: one line, not its traceback
            raise ModelError(f"onnxruntime failed to run ({first_line(exc)})") from None

    return run_ort, names, None


def _split(outputs: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]] | None:
    """Per-record slices of batched outputs, or None when an output has no matching batch axis."""
    total = sum(sizes)
    if any(np.ndim(o) == 0 or np.shape(o)[0] != total for o in outputs):
        return None
    bounds = np.cumsum([0, *sizes])
    return [[np.asarray(o)[bounds[i] : bounds[i + 1]] for o in outputs] for i in range(len(sizes))]


def run(args: argparse.Namespace) -> int:
    import h5py

    from pytest_qaccuracy.atomic import discard, temp_name, write_errors
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.data.progress import task
    from pytest_qaccuracy.model.batch import stacking
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads < 0:
        raise InputError(f"--threads must be >= 0, got {args.threads}")
    model = load_model(args.model)
    # a declared batch of 1 is freed unless a Reshape bakes it in; then records run one at a time
    runnable, stacks = stacking(model)
    try:
        execute, names, scheme = _runner(runnable, args.backend, args.scheme, args.threads)
    except QAccuracyError as exc:
        if isinstance(exc, InputError):
            raise
        raise ModelError(f"{args.model}: {exc}") from None
    dataset = bind_dataset(load_dataset(args.data), graph_inputs(model), args.allow_nonfinite)
    batch_size = args.batch_size if stacks else 1
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(out)  # named before it exists, so an interrupt at any point finds it
    records = 0
    with write_errors("--out", out):
        try:
            with h5py.File(tmp, "w-") as h5, task("run", len(dataset)) as advance:
                h5.attrs["model"] = args.model.name
                h5.attrs["backend"] = args.backend
                h5.attrs["scheme"] = scheme or ""
                h5.attrs["output_names"] = json.dumps(names)
                group = h5.create_group("value")
                for batch in dataset.iter_batches(batch_size):
                    per_record = _split(_execute(execute, batch.stacked()), [_batch_size(r) for r in batch.records])
                    if per_record is None:  # outputs without a batch axis: one record at a time
                        per_record = [_execute(execute, r) for r in batch.records]
                    for offset, outputs in enumerate(per_record):
                        record = group.create_group(str(batch.start + offset))
                        for index, value in enumerate(outputs):
                            record.create_dataset(str(index), data=np.asarray(value))
                    records += len(batch)
                    advance(len(batch))
            os.replace(tmp, out)
        except BaseException:
            discard(tmp)
            raise
    print(
        f"wrote {records} record(s) x {len(names)} output(s) to {out} ({args.backend}{f', {scheme}' if scheme else ''})"
    )
    return 0


def _batch_size(record: dict[str, np.ndarray]) -> int:
    first = next(iter(record.values()))
    return int(first.shape[0]) if first.ndim else 1


def _execute(execute: Runner, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return execute(feeds)
    except QAccuracyError as exc:
        if isinstance(exc, InputError):
            raise
        raise ModelError(str(exc)) from None
