"""Text tables: value formatting, ranking of the worst layers, and the combined comparison table."""

from __future__ import annotations

import pytest

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.numbers import format_metric
from pytest_qaccuracy.report.tables import comparison_table, rank_layers, shorten


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [
        ("mse", None, "n/a"),
        ("sqnr", 31.2, "31.20 dB"),
        ("sqnr", -3.456, "-3.46 dB"),
        ("cosine", 0.999953, "0.999953"),
        ("cosine", 0.95, "0.9500"),
        ("cosine", 1.0, "1.0000"),
        ("mse", 0.0, "0"),
        ("mse", 1.23456e-7, "1.235e-07"),
        ("tae", 51.2, "51.2"),
        ("mpeir", 0.0128, "0.0128"),
        ("mse", float("nan"), "nan"),
    ],
)
def test_format_metric(name, value, text):
    assert format_metric(name, value) == text


def test_rank_lower_is_better_worst_first_none_last(small_result):
    assert [x.tensor for x in rank_layers(small_result, "mse")] == ["conv2_out", "logits", "conv1_out", "relu1_out"]
    assert [x.tensor for x in rank_layers(small_result, "mpeir")] == ["conv2_out", "logits", "conv1_out", "relu1_out"]


def test_rank_higher_is_better_lowest_first(small_result):
    assert [x.tensor for x in rank_layers(small_result, "cosine")] == ["conv2_out", "logits", "conv1_out", "relu1_out"]
    assert rank_layers(small_result, "sqnr")[0].tensor == "conv2_out"


def test_rank_ties_keep_topological_order(make_result):
    result = make_result([(f"t{i}", "Add", {"mse": 1.0}) for i in range(5)], definitions={"mse": "x"})
    assert [x.order for x in rank_layers(result, "mse")] == [0, 1, 2, 3, 4]


def test_rank_unknown_metric_names_the_metrics(small_result):
    with pytest.raises(InputError, match=r"'psnr'.*mse, mpeir, cosine, sqnr"):
        rank_layers(small_result, "psnr")


def test_comparison_table_layout(small_result):
    text = comparison_table(small_result, top=2)
    lines = text.splitlines()
    assert lines[0] == "models/net.int8.onnx vs models/net.onnx on calib.h5 (16 records)"
    assert "Outputs" in lines
    out_header = lines[lines.index("Outputs") + 1].split()
    assert out_header == ["output", "mse", "mpeir", "cosine", "sqnr"]
    logits_row = lines[lines.index("Outputs") + 3]
    assert logits_row.split() == ["logits", "0.01", "0.2", "0.9950", "25.00", "dB"]
    title = "Worst 2 of 4 layers by mse (highest first)"
    assert title in lines
    header = lines[lines.index(title) + 1].split()
    assert header == ["order", "tensor", "op_type", "mse", "mpeir", "cosine", "sqnr"]
    rows = lines[lines.index(title) + 3 :]
    assert rows[0].split()[:3] == ["2", "conv2_out", "Conv"]
    assert rows[1].split()[:3] == ["3", "logits", "Gemm"]
    assert "1 fp32 tensor(s) had no quantized counterpart" in text
    assert not text.endswith("\n")


def test_comparison_table_rank_by_and_none(small_result):
    text = comparison_table(small_result, top=10, rank_by="sqnr")
    assert "Worst 4 of 4 layers by sqnr (lowest first)" in text
    relu = next(line for line in text.splitlines() if "relu1_out" in line)
    assert "n/a" in relu


def test_comparison_table_without_layers_or_outputs(make_result):
    result = make_result([], outputs=[("y", {"mse": 0.5})], definitions={"mse": "x"})
    text = comparison_table(result, top=5)
    assert "Layers: none compared" in text
    assert "0.5" in text
    assert "Outputs: none compared" in comparison_table(make_result([("a", "Conv", {"mse": 1.0})]), top=0)


def test_shorten_keeps_both_ends():
    name = "a" * 40 + "MIDDLE" + "z" * 40
    short = shorten(name, 21)
    assert len(short) == 21 and short.startswith("a" * 10) and short.endswith("z" * 10) and "…" in short
    assert shorten("short", 21) == "short"
