"""Sensitivity measured at intermediate tensors (``outputs=``, ``--output``; Horizon's ``output_node``).

The golden is independent of our graph surgery: onnx's own extractor cuts the fp32 model at the
tensor, onnxruntime's quantizer quantizes the cut model on the zoo's calibration data, and the plain
(uncut) analysis of that pair must give the same numbers.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.sensitivity import SensitivityResult, node_sensitivity
from pytest_qaccuracy.analysis.sensitivity_report import analyse_pair
from pytest_qaccuracy.cli import main
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.model.cut import cut_pair
from pytest_qaccuracy.report.sensitivity_tables import sensitivity_table
from pytest_qaccuracy.runtime import RuntimeOptions

METRICS = ("cosine", "mse")


def _quantized_cut(zoo, tmp_path, tensors: list[str]) -> ModelPair:
    """The fp32 model cut by onnx.utils.extract_model at ``tensors``, quantized by onnxruntime."""
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    fp32 = tmp_path / "cut.onnx"
    onnx.utils.extract_model(str(zoo["fp32"]), str(fp32), ["x"], tensors)
    quantized = modelzoo.quantize(fp32, tmp_path / "cut.qdq.onnx", modelzoo.random_inputs(8, seed=3))
    return ModelPair(fp32, quantized)


def _by_node(result: SensitivityResult) -> dict[tuple[str, str], float | None]:
    return {(n.node, m): v for n in result.nodes for m, v in n.metrics.items()}


@pytest.mark.parametrize("tensors", [["conv3"], ["relu1"], ["sig1", "add1"]], ids=["conv3", "folded-relu1", "two"])
@pytest.mark.parametrize("mode", ["single", "leave-one-out"])
def test_measuring_at_a_tensor_equals_quantizing_the_model_cut_there(zoo, tmp_path, tensors, mode):
    """relu1 is folded into conv1's Q/DQ pair by the quantizer; sig1 and add1 are two outputs at once."""
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    mine = node_sensitivity(pair, zoo["data"], mode, metrics=METRICS, outputs=tensors)
    gold = node_sensitivity(_quantized_cut(zoo, tmp_path, tensors), zoo["data"], mode, metrics=METRICS)
    assert _by_node(mine) == _by_node(gold)  # exactly: the same partial models run on the same data
    assert [n.node for n in mine.nodes] == [n.node for n in gold.nodes]
    assert mine.baseline == gold.baseline
    assert mine.measured_at == tensors and gold.measured_at == []
    assert all(set(n.outputs) == set(tensors) for n in mine.nodes)


def test_cutting_before_a_damaged_node_drops_it_and_after_it_ranks_it_first(zoo, damaged):
    pair = ModelPair(zoo["fp32"], damaged)  # conv3's weight scale times 40
    before = node_sensitivity(pair, zoo["data"], metrics="cosine", outputs=["pool1"])
    assert [n.node for n in before.nodes] == ["conv1", "add1", "conv2", "cat1", "pool1"]  # upstream of pool1 only
    assert min(n.metrics["cosine"] for n in before.nodes) > 0.999
    after = node_sensitivity(pair, zoo["data"], metrics="cosine", outputs=["conv3"])
    assert after.ranked()[0].node == "conv3" and after.ranked()[0].metrics["cosine"] < 0.99


def test_reuse_gives_the_naive_results_at_a_cut(zoo):
    """add1 becomes a graph output that cat1 still reads: a partial model with add1's own pair off
    must keep that pair for cat1 (the naive strategy builds such whole models)."""
    pair = ModelPair(zoo["fp32"], zoo["qdq_s8_pc"])
    options = RuntimeOptions(batch_size=5, threads=2)
    for mode in ("single", "leave-one-out"):
        fast = node_sensitivity(pair, zoo["data"], mode, metrics=METRICS, options=options, outputs=["gap", "add1"])
        slow = node_sensitivity(
            pair, zoo["data"], mode, metrics=METRICS, options=options, outputs=["gap", "add1"], strategy="naive"
        )
        assert _by_node(fast) == pytest.approx(_by_node(slow), rel=1e-9)


def test_names_resolve_from_nodes_quantized_tensors_and_outputs(zoo, tmp_path):
    """A node name means its outputs; a quantized tensor its fp32 counterpart; repeats count once."""
    import modelzoo

    logging.getLogger().setLevel(logging.ERROR)
    model = onnx.load(str(zoo["fp32"]))
    for node in model.graph.node:
        node.name = f"node_{node.name}"  # node names now differ from tensor names
    onnx.save(model, str(tmp_path / "renamed.onnx"))
    quantized = modelzoo.quantize(tmp_path / "renamed.onnx", tmp_path / "renamed.qdq.onnx", modelzoo.random_inputs(8))
    pair = ModelPair(tmp_path / "renamed.onnx", quantized)
    cut = cut_pair(pair, ["node_conv3", "conv3_DequantizeLinear_Output", "conv3", "logits"])
    assert [o.name for o in cut.fp32.graph.output] == ["conv3", "logits"]
    assert [o.name for o in cut.quantized.graph.output] == ["conv3_DequantizeLinear_Output", "logits"]
    assert cut.fp32_path == pair.fp32_path and cut.quantized_path == pair.quantized_path


def test_cut_models_run_and_hold_only_what_the_cut_needs(zoo):
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    cut = cut_pair(pair, ["relu1"])
    assert {t.name for t in cut.fp32.graph.initializer} == {"w1", "b1"}
    assert [n.name for n in cut.fp32.graph.node] == ["conv1", "relu1"]
    assert "w3" not in {t.name for t in cut.quantized.graph.initializer} and len(cut.quantized.graph.node) < 10
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    exposed = onnx.load(str(zoo["fp32"]))
    exposed.graph.output.append(onnx.helper.make_tensor_value_info("relu1", onnx.TensorProto.FLOAT, None))
    want = _run(exposed, x)[1]
    np.testing.assert_array_equal(_run(cut.fp32, x)[0], want)
    (name,) = [o.name for o in cut.quantized.graph.output]
    whole = onnx.load(str(zoo["qdq_u8"]))
    whole.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    np.testing.assert_array_equal(_run(cut.quantized, x)[0], _run(whole, x)[1])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_bad_names_say_what_would_do(zoo):
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with pytest.raises(InputError, match=r"cannot measure at 'conv33'.*net\.onnx.*close names: conv3"):
        cut_pair(pair, ["conv33"])
    with pytest.raises(InputError, match="'x': it is an input"):
        cut_pair(pair, ["x"])
    # QOperator folds conv1's Relu into QLinearConv: the node exists, its output has no counterpart
    pair = ModelPair(zoo["fp32"], zoo["qop_u8"])
    assert "conv1" not in {m.fp32 for m in pair.matching.matches}
    folded = r"'conv1': the output\(s\) of this node of net\.onnx \(conv1\) have no counterpart"
    with pytest.raises(InputError, match=folded):
        cut_pair(pair, ["conv1"])
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with pytest.raises(InputError, match="at least one"):
        cut_pair(pair, [])
    with pytest.raises(ModelError, match="no quantized node 'gemm'"):  # gemm lies after the cut
        node_sensitivity(pair, zoo["data"], nodes=["gemm"], outputs=["conv3"])
    with pytest.raises(ModelError, match="needs a QDQ model"):
        node_sensitivity(ModelPair(zoo["fp32"], zoo["qop_u8"]), zoo["data"], outputs=["conv3"])


def test_measured_at_round_trips_and_titles_the_table(zoo):
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    report = analyse_pair(pair, zoo["data"], "cosine", target="cosine>=0.9999", outputs=["pool1"], max_excluded=2)
    result = report.sensitivity
    assert SensitivityResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert "measured at pool1 on" in sensitivity_table(result).splitlines()[0]
    assert report.cumulative.nodes == ["conv1", "conv2", "add1", "cat1", "pool1"]  # the curve ends at the cut
    assert set(report.sweep.steps[0].outputs) == {"pool1"}
    whole = node_sensitivity(pair, zoo["data"], metrics="cosine", nodes=["gemm"])
    assert whole.measured_at == [] and "measured at" not in sensitivity_table(whole)


def test_cli_output_option(zoo, damaged, tmp_path, capsys):
    out = tmp_path / "sens.json"
    args = ["sensitivity", str(zoo["fp32"]), str(damaged), "--data", str(zoo["data"])]
    assert main([*args, "--output", "conv3", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "measured at conv3" in printed.splitlines()[0]
    data = json.loads(out.read_text())["sensitivity"]
    assert data["measured_at"] == ["conv3"] and data["nodes"][0]["node"] == "conv3"
    assert {n["node"] for n in data["nodes"]} == {"conv1", "conv2", "add1", "cat1", "pool1", "conv3"}
    assert main([*args, "--output", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot measure at 'nope'") and len(err.strip().splitlines()) == 1
