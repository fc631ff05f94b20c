"""Model pairs: safe loading (external data stays in the model's folder) and input agreement."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.errors import ModelError
from pytest_qaccuracy.model import ModelPair, load_model


def _matmul_model(name: str = "x", shape=("N", 4), dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", [name, "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info(name, dtype, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [shape[0], 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_external_data_inside_the_folder_loads(tmp_path):
    model = _matmul_model()
    onnx.save(
        model,
        str(tmp_path / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    loaded = load_model(tmp_path / "m.onnx")
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), np.arange(16).reshape(4, 4))


def test_external_data_outside_the_folder_is_refused(tmp_path):
    (tmp_path / "models").mkdir()
    model = _matmul_model()
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="secret.bin", size_threshold=0)
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../secret.bin"
    onnx.save(proto, str(tmp_path / "models" / "m.onnx"))
    with pytest.raises(ModelError, match=r"initializer 'w' points at external data '\.\./secret\.bin' outside"):
        load_model(tmp_path / "models" / "m.onnx")


def test_unreadable_and_missing_models(tmp_path):
    with pytest.raises(ModelError, match=r"nope\.onnx: model file not found"):
        load_model(tmp_path / "nope.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x00\xffgarbage")
    with pytest.raises(ModelError, match=r"bad\.onnx: not a readable ONNX model"):
        load_model(tmp_path / "bad.onnx")


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        (_matmul_model(name="z"), r"input names differ: a\.onnx has \['x'\], b\.onnx has \['z'\]"),
        (_matmul_model(shape=("N", 5)), r"input 'x': shape \(N, 4\) in a\.onnx but \(N, 5\) in b\.onnx"),
        (_matmul_model(dtype=TensorProto.DOUBLE), r"input 'x': dtype float32 in a\.onnx but float64 in b\.onnx"),
    ],
)
def test_pair_inputs_must_agree(tmp_path, quant, message):
    onnx.save(_matmul_model(), str(tmp_path / "a.onnx"))
    onnx.save(quant, str(tmp_path / "b.onnx"))
    with pytest.raises(ModelError, match=message):
        ModelPair(tmp_path / "a.onnx", tmp_path / "b.onnx")


def test_live_nodes_keep_what_a_subgraph_reads_from_outside():
    """An If branch reads ``r`` without naming it as an input: the Relu producing it must stay."""
    import onnxruntime as ort

    from pytest_qaccuracy.model.graph import live_nodes

    branch = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["neg"])],
        "then",
        [],
        [helper.make_tensor_value_info("neg", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["same"])],
        "else",
        [],
        [helper.make_tensor_value_info("same", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["unused"], name="dead"),
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0, name="max"),
        helper.make_node("Greater", ["m", "zero"], ["c"], name="cond"),
        helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other, name="if"),
    ]
    kept = live_nodes(nodes, ["y"])
    assert [n.name for n in kept] == ["relu", "max", "cond", "if"]
    graph = helper.make_graph(
        kept,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    # IR 8: every onnxruntime the package supports loads it (onnx's newest IR is newer than some)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.array([-1.0, 2.0, 0.5], np.float32)})
    np.testing.assert_array_equal(y, [-0.0, -2.0, -0.5])
