"""The batch a model accepts: whether records may be stacked on axis 0, and the model that takes them.

Exports often declare batch 1 (PaddleOCR, YOLO, models fixed for a static-shape target). When no
Reshape bakes that batch in, the declared 1 is made symbolic so records can run stacked (onnxruntime
and the integer backend both check feeds against the declared shape); otherwise records run one at a
time. Every command and runner picks its batch here, so none feeds a model a batch it refuses.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx

FREE_BATCH = "qaccuracy_batch"


def batch_dims(model: onnx.ModelProto) -> list[int | str | None]:
    """The declared first dimension of every graph input (an int, a symbol, or None when unknown)."""
    init = {t.name for t in model.graph.initializer}
    dims: list[int | str | None] = []
    for value in model.graph.input:
        if value.name in init:
            continue
        shape = value.type.tensor_type.shape.dim if value.type.tensor_type.HasField("shape") else []
        if not shape:
            dims.append(None)
        else:
            d = shape[0]
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return dims


def bakes_batch(model: onnx.ModelProto) -> bool:
    """Whether a Reshape fixes the element count of a tensor computed from the inputs: its shape is a
    constant with no ``-1`` and no ``0``, so records stacked on any axis cannot pass through it."""
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and node.output:
                constants[node.output[0]] = value
    folded = set(constants)  # tensors computed from constants alone have no records in them
    for node in model.graph.node:
        if all(not x or x in folded for x in node.input):
            folded.update(node.output)
            continue
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in constants:
            shape = onnx.numpy_helper.to_array(constants[node.input[1]])
            if shape.size and not np.isin(shape, (-1, 0)).any():
                return True
    return False


def free_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose declared batch-1 dimensions (inputs, outputs, value infos) are symbolic."""
    out = copy.deepcopy(model)
    free_batch_in_place(out)
    return out


def free_batch_in_place(model: onnx.ModelProto) -> None:
    init = {t.name for t in model.graph.initializer}
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if value.name in init or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = FREE_BATCH


def stacking(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """The model to run and whether records may run stacked on axis 0.

    A dynamic batch stacks unless a Reshape bakes it; a declared batch of 1 with no baking Reshape is
    freed (a copy) and stacks; any other fixed batch runs one record at a time.
    """
    dims = batch_dims(model)
    if bakes_batch(model):
        return model, False
    if all(not isinstance(d, int) for d in dims):
        return model, True
    if all(d == 1 for d in dims):
        return free_batch(model), True
    return model, False
