"""visq.json: exact structure, independently computed slot edges, degenerate ranges."""

from __future__ import annotations

import json
import math

import pytest

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.report.visq import visq_document, write_visq

YLORRD9 = ["#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#bd0026", "#800026"]


def expected_slots(lo: float, hi: float, colors: list[str] = YLORRD9) -> list[dict]:
    step = (hi - lo) / 9
    return [{"b": lo + i * step, "e": lo + (i + 1) * step, "c": colors[i]} for i in range(9)]


def assert_slots(actual: list[dict], expected: list[dict]) -> None:
    assert [set(s) for s in actual] == [{"b", "e", "c"}] * 9
    assert [s["c"] for s in actual] == [s["c"] for s in expected]
    for a, e in zip(actual, expected, strict=True):
        assert a["b"] == pytest.approx(e["b"], rel=1e-12, abs=1e-300)
        assert a["e"] == pytest.approx(e["e"], rel=1e-12, abs=1e-300)
    assert actual[0]["b"] == expected[0]["b"] and actual[-1]["e"] == expected[-1]["e"]
    assert all(actual[i]["e"] == actual[i + 1]["b"] for i in range(8))


def all_numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from all_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from all_numbers(v)
    elif isinstance(obj, float | int) and not isinstance(obj, bool):
        yield obj


def test_mse_document_exact(small_result):
    doc = visq_document(small_result, "mse")
    assert list(doc) == ["meta", "error"]
    assert list(doc["meta"]) == ["model", "metric", "colorscheme"]
    assert doc["meta"]["model"] == "net.onnx"
    assert doc["meta"]["metric"] == "MSE"
    assert doc["error"] == [{"conv1_out": 0.002, "relu1_out": 0.0005, "conv2_out": 0.02, "logits": 0.01}]
    assert_slots(doc["meta"]["colorscheme"], expected_slots(0.0005, 0.02))


def test_mpeir_range_is_fixed_and_none_is_skipped(small_result):
    doc = visq_document(small_result, "mpeir", title="MobileNet int8")
    assert doc["meta"]["title"] == "MobileNet int8"
    assert doc["meta"]["metric"] == "MPEIR"
    assert_slots(doc["meta"]["colorscheme"], expected_slots(0.0, 1.0))
    assert doc["error"] == [{"conv1_out": 0.05, "conv2_out": 0.3, "logits": 0.2}]  # relu1_out: None


def test_srmse_range_starts_at_zero(make_result):
    result = make_result([("a", "Conv", {"srmse": 0.2}), ("b", "Conv", {"srmse": 0.45})], definitions={"srmse": "x"})
    assert_slots(visq_document(result, "srmse")["meta"]["colorscheme"], expected_slots(0.0, 0.45))


def test_tae_and_other_metrics_use_min_max(make_result):
    defs = {"tae": "x", "max_abs": "y"}
    result = make_result(
        [("a", "Conv", {"tae": 3.0, "max_abs": -1.0}), ("b", "Add", {"tae": 12.0, "max_abs": 2.0})], definitions=defs
    )
    assert_slots(visq_document(result, "tae")["meta"]["colorscheme"], expected_slots(3.0, 12.0))
    assert_slots(visq_document(result, "max_abs")["meta"]["colorscheme"], expected_slots(-1.0, 2.0))
    assert visq_document(result, "max_abs")["meta"]["metric"] == "MAX_ABS"


def test_higher_is_better_reverses_colours(small_result):
    doc = visq_document(small_result, "cosine")
    assert doc["meta"]["metric"] == "COSINE"
    assert_slots(doc["meta"]["colorscheme"], expected_slots(0.99, 0.9999, YLORRD9[::-1]))
    # the worst (lowest) cosine falls in the first slot, which is dark red
    worst = min(doc["error"][0].values())
    first = doc["meta"]["colorscheme"][0]
    assert first["b"] <= worst <= first["e"] and first["c"] == "#800026"


def test_full_precision_is_kept(make_result):
    result = make_result(
        [("a", "Conv", {"mse": 1.2345678901234e-7}), ("b", "Conv", {"mse": 3.3e-9})], definitions={"mse": "x"}
    )
    text = json.dumps(visq_document(result, "mse"))
    assert json.loads(text)["error"][0] == {"a": 1.2345678901234e-7, "b": 3.3e-9}


@pytest.mark.parametrize(
    ("metric", "value", "lo", "hi"),
    [
        ("mse", 0.0, 0.0, 1.0),  # all zero: 0..1, the value on the lightest colour
        ("mse", 0.5, 0.5, 0.75),  # all equal: widened upward by |v|/2
        ("tae", 8.0, 8.0, 12.0),
        ("srmse", 0.0, 0.0, 1.0),
        ("cosine", 1.0, 0.5, 1.0),  # higher is better: widened downward, the value stays light
        ("sqnr", -4.0, -6.0, -4.0),
        ("mse", 5e-324, 5e-324, 1.0 + 5e-324),  # subnormal: half of it rounds to 0, fall back to width 1
    ],
)
def test_degenerate_range_still_gives_a_valid_file(make_result, tmp_path, metric, value, lo, hi):
    result = make_result([(f"t{i}", "Conv", {metric: value}) for i in range(3)], definitions={metric: "x"})
    path = write_visq(tmp_path / f"net.{metric}.visq.json", result, metric)
    doc = json.loads(path.read_text())
    scheme = doc["meta"]["colorscheme"]
    assert scheme[0]["b"] == lo and scheme[-1]["e"] == hi
    assert all(s["b"] < s["e"] for s in scheme)
    colors = YLORRD9[::-1] if metric in ("cosine", "sqnr") else YLORRD9
    slot = next(s for s in scheme if s["b"] <= value <= s["e"])
    assert slot["c"] == "#ffffcc" and [s["c"] for s in scheme] == colors


def test_no_values_and_non_finite_values(make_result, tmp_path):
    nan, inf = float("nan"), float("inf")
    result = make_result(
        [("a", "Conv", {"mse": nan}), ("b", "Conv", {"mse": inf}), ("c", "Conv", {"mse": None})],
        definitions={"mse": "x"},
    )
    path = write_visq(tmp_path / "x.visq.json", result, "mse")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text)
    assert doc["error"] == [{}]
    assert_slots(doc["meta"]["colorscheme"], expected_slots(0.0, 1.0))
    assert all(math.isfinite(x) for x in all_numbers(doc))


def test_outputs_that_are_not_layers_are_included(make_result):
    result = make_result(
        [("a", "Conv", {"mse": 0.1})], outputs=[("a", {"mse": 0.1}), ("y", {"mse": 0.4})], definitions={"mse": "x"}
    )
    assert visq_document(result, "mse")["error"] == [{"a": 0.1, "y": 0.4}]
    outputs_only = make_result([], outputs=[("y", {"mse": 0.4}), ("z", {"mse": 0.2})], definitions={"mse": "x"})
    assert visq_document(outputs_only, "mse")["error"] == [{"y": 0.4, "z": 0.2}]


def test_consumer_like_read(small_result, tmp_path):
    """circle-mpqsolver reads error[0] as name -> float and defaults missing names to 0.0."""
    path = write_visq(tmp_path / "net.mse.visq.json", small_result, "mse", model_name="net.circle")
    data = json.loads(path.read_text())
    errors = {name: float(value) for name, value in data["error"][0].items()}
    assert errors["conv2_out"] == 0.02
    assert errors.get("missing", 0.0) == 0.0
    assert data["meta"]["model"] == "net.circle"
    # a viewer colours a value by the slot that contains it
    scheme = data["meta"]["colorscheme"]
    color = next(s["c"] for s in scheme if s["b"] <= errors["conv2_out"] <= s["e"])
    assert color == "#800026"


def test_hostile_names_round_trip(make_result, tmp_path):
    names = ['a"b</script>', "back\\slash", "uni\u2028code", "<&>"]
    result = make_result([(n, "Conv", {"mse": float(i)}) for i, n in enumerate(names)], definitions={"mse": "x"})
    path = write_visq(tmp_path / "h.visq.json", result, "mse")
    assert list(json.loads(path.read_text())["error"][0]) == names


def test_unknown_metric(small_result):
    with pytest.raises(InputError, match=r"no metric 'tae'.*mse, mpeir, cosine, sqnr"):
        visq_document(small_result, "tae")
