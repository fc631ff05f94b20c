"""Loading ONNX models safely: external data must stay inside the model's own folder."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from pytest_qaccuracy.errors import ModelError

#: ONNX element types as numpy dtype names (for messages and dataset checks).
ELEM_TYPE_NAMES = {
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.FLOAT16: "float16",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.INT32: "int32",
    TensorProto.UINT32: "uint32",
    TensorProto.INT64: "int64",
    TensorProto.UINT64: "uint64",
    TensorProto.BOOL: "bool",
}


@dataclass(frozen=True, slots=True)
class InputSpec:
    """A graph input: name, numpy dtype name, and shape (``None`` or a name for a dynamic dim)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]

    def describe_shape(self) -> str:
        dims = ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in self.shape)
        return f"({dims}{',' if len(self.shape) == 1 else ''})"


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Load an ONNX model, with its external data, refusing data files outside its folder.

    Raises:
        ModelError: the file is missing, is not an ONNX model, or points outside its folder.
    """
    path = Path(path)
    if path.is_dir():
        raise ModelError(f"{path}: a folder, not an ONNX model file")
    if not path.is_file():
        raise ModelError(f"{path}: model file not found")
    if path.stat().st_size == 0:  # protobuf reads 0 bytes as a valid, empty model
        raise ModelError(f"{path}: empty file, not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.HasField("graph"):
        raise ModelError(f"{path}: no graph, not an ONNX model")
    _check_external_data(model, path)
    external = [t for t in _all_tensors(model) if t.data_location == TensorProto.EXTERNAL]
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
        for tensor in external:  # onnx before 1.17 reads a short file without a word
            _check_size(tensor)
    except Exception as exc:
        raise ModelError(f"{path}: cannot load external data ({exc})") from None
    return model


def _check_size(tensor: TensorProto) -> None:
    """Raise ValueError unless ``tensor``'s loaded bytes are those its shape and type need."""
    if tensor.data_type not in ELEM_TYPE_NAMES:  # strings, packed 4-bit types: no fixed byte count here
        return
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    need = math.prod(tensor.dims) * itemsize
    if len(tensor.raw_data) != need:
        raise ValueError(f"'{tensor.name}' has {len(tensor.raw_data)} bytes of data, its shape and type need {need}")


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    folder = path.parent.resolve()
    for tensor in _all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or os.path.isabs(location) or not target.is_relative_to(folder):
            raise ModelError(
                f"{path}: initializer '{tensor.name}' points at external data '{location}' "
                f"outside the model's folder {folder}"
            )
        if not target.is_file():
            raise ModelError(f"{path}: external data file '{location}' of '{tensor.name}' not found")


def _all_tensors(model: onnx.ModelProto):
    yield from onnx.external_data_helper._get_all_tensors(model)


def graph_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed (graph inputs that are not initializers), in graph order."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        specs.append(value_spec(value))
    return specs


def value_spec(value: onnx.ValueInfoProto) -> InputSpec:
    tensor_type = value.type.tensor_type
    dtype = ELEM_TYPE_NAMES.get(tensor_type.elem_type, helper.tensor_dtype_to_string(tensor_type.elem_type))
    shape: tuple[int | str | None, ...] = ()
    if tensor_type.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim)
    return InputSpec(value.name, dtype, shape)
