"""Float fallback: ops without a kernel of ours run through ``onnx.reference`` one node at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pytest_qaccuracy.backend.graph import Step
from pytest_qaccuracy.backend.registry import unsupported

#: inputs where an empty tensor means "not given" (Resize-11 has no optional inputs, so models pass an empty
#: roi or scales). onnx.reference before 1.22 indexes an empty roi (IndexError); onnx 1.22 drops it
#: itself. Handing such inputs over as absent is the same node by the spec, for every onnx version.
_EMPTY_MEANS_ABSENT: dict[tuple[str, str], tuple[int, ...]] = {("", "Resize"): (1, 2, 3)}


def reference_kernel(step: Step, opsets: dict[str, int]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """A runner for ``step`` built on ``onnx.reference.ReferenceEvaluator``.

    Raises:
        UnsupportedOpError: ``onnx.reference`` has no implementation for the op either.
    """
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    proto = step.proto
    if proto is None or list(proto.input) != step.inputs or list(proto.output) != step.outputs:
        proto = helper.make_node(
            step.op_type, step.inputs, step.outputs, name=step.name, domain=step.domain, **step.attrs
        )
    reference_opsets = {d or "": v for d, v in opsets.items()}
    try:
        evaluator = ReferenceEvaluator(proto, opsets=reference_opsets)
    except Exception as exc:
        raise unsupported(
            step.name, step.domain, step.op_type, opsets.get(step.domain, 1), f"onnx.reference: {exc}"
        ) from None
    names = list(proto.input)
    optional = _EMPTY_MEANS_ABSENT.get((step.domain, step.op_type), ())
    evaluators: dict[tuple[int, ...], Any] = {(): evaluator}

    def without(absent: tuple[int, ...]) -> Any:
        """The evaluator of the node with the ``absent`` inputs left out (named "")."""
        if absent not in evaluators:
            node = type(proto)()
            node.CopyFrom(proto)
            for i in absent:
                node.input[i] = ""
            evaluators[absent] = ReferenceEvaluator(node, opsets=reference_opsets)
        return evaluators[absent]

    def run(args: list[Any]) -> tuple[Any, ...]:
        absent = tuple(i for i in optional if i < len(args) and args[i] is not None and np.size(args[i]) == 0)
        pairs = enumerate(zip(names, args, strict=False))
        feeds = {name: value for i, (name, value) in pairs if name and i not in absent}
        return tuple(without(absent).run(None, feeds))

    return run
