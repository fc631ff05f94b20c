"""Cumulative error curves (Horizon's plot_acc_error) on real onnxruntime runs."""

from __future__ import annotations

import json

import pytest

from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.cumulative import (
    PartialConfig,
    as_mapping,
    cumulative_in,
    parse_configs,
    running_mean,
)
from pytest_qaccuracy.analysis.sensitivity import open_session
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.report.sensitivity_tables import cumulative_table, write_sensitivity_artifacts


def test_running_mean_is_the_mean_of_the_first_n_points():
    assert running_mean([1.0, 0.5, None, 0.0]) == [1.0, 0.75, 0.75, 0.5]
    assert running_mean([None, 2.0]) == [None, 2.0]


@pytest.fixture(scope="module")
def curves(zoo):
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    session = open_session(pair, zoo["data"], "cosine")
    configs = [
        PartialConfig("fully quantized"),
        PartialConfig("weights only", kind="weight"),
        *parse_configs(quantize=[["gemm"]], exclude=[["conv3"]]),
    ]
    try:
        yield pair, cumulative_in(session, configs), cumulative_in(session, configs[:1], average_mode=True)
    finally:
        session.close()


def test_fully_quantized_curve_ends_at_the_output_error(curves, zoo):
    pair, result, _ = curves
    assert result.nodes[-1] == "matmul"
    whole = compare(pair, zoo["data"], "cosine", capture="reference", layers=False)
    assert as_mapping(result)["fully quantized"][-1] == pytest.approx(whole.outputs[0].metrics["cosine"], abs=1e-9)
    assert all(v < 1.0 for v in as_mapping(result)["fully quantized"])


def test_quantizing_one_node_leaves_everything_before_it_exact(curves):
    _, result, _ = curves
    values = as_mapping(result)["quantize gemm"]
    before = result.nodes.index("flat")  # flat's output pair is gemm's input pair
    assert values[:before] == [1.0] * before
    assert all(v < 1.0 for v in values[before:])


def test_weights_only_keeps_activations_in_float(curves):
    _, result, _ = curves
    weights, full = as_mapping(result)["weights only"], as_mapping(result)["fully quantized"]
    assert 0.999 < weights[0] < 1.0  # conv1 with int8 weights, float input and output
    assert weights[0] > full[0]  # the fully quantized conv1 also rounds its input and output


def test_excluding_a_node_gives_it_its_float_output_again(curves):
    _, result, _ = curves
    full, excluded = as_mapping(result)["fully quantized"], as_mapping(result)["all but conv3"]
    i = result.nodes.index("conv3")
    assert excluded[:i] == full[:i]
    assert excluded[i] != full[i]


def test_average_mode_is_the_running_mean(curves):
    _, result, averaged = curves
    assert averaged.average_mode
    assert as_mapping(averaged)["fully quantized"] == pytest.approx(running_mean(as_mapping(result)["fully quantized"]))


def test_chart_data_and_artifacts(curves, tmp_path):
    _, result, _ = curves
    chart = result.chart_data()
    assert chart["x"] == result.nodes and chart["series"][0]["name"] == "fully quantized"
    written = write_sensitivity_artifacts("net", tmp_path / "out", tmp_path / "all.json", cumulative=result)
    names = sorted(p.name for p in written)
    assert names == ["all.json", "net.cumulative.chart.json", "net.cumulative.json"]
    data = json.loads((tmp_path / "out" / "net.cumulative.chart.json").read_text())
    assert len(data["series"][0]["y"]) == len(result.nodes)
    assert "conv3" in cumulative_table(result)
