"""Float fallback: ops without a kernel of ours run through ``onnx.reference`` one node at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_qaccuracy.backend.graph import Step
from pytest_qaccuracy.backend.registry import unsupported


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
    try:
        evaluator = ReferenceEvaluator(proto, opsets={d or "": v for d, v in opsets.items()})
    except Exception as exc:
        raise unsupported(
            step.name, step.domain, step.op_type, opsets.get(step.domain, 1), f"onnx.reference: {exc}"
        ) from None
    names = list(proto.input)

    def run(args: list[Any]) -> tuple[Any, ...]:
        feeds = {name: value for name, value in zip(names, args, strict=False) if name}
        return tuple(evaluator.run(None, feeds))

    return run
