"""Unit tests of the analysis package's small modules, in pytest's own process (the `analysis` mutation
group, docs/testing.md): the comparison JSON's records (`results.py`), named output views
(`slices.py`), the deadline, the sweep's target and sentences, the cumulative curves and their
configurations, the sensitivity report's document and plumbing, the fp32 reference cache, and the
task-metric calls (`task.py`, `task_sweep.py`) against onnxruntime runs of the zoo's models.

Expected values are written out by hand from the documented layouts and formulas, or computed with
onnxruntime directly, never read back from the code under test. Where a test replaces the models by
recorders (`sweep_in`, `analyse_pair`), the recorded values are hand-written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis import deadline as deadline_module
from pytest_qaccuracy.analysis import sensitivity_report as report_module
from pytest_qaccuracy.analysis import task as task_module
from pytest_qaccuracy.analysis import task_sweep as task_sweep_module
from pytest_qaccuracy.analysis.cumulative import (
    DEFAULT_CONFIGS,
    KINDS,
    CumulativeCurve,
    CumulativeResult,
    PartialConfig,
    as_mapping,
    cumulative_in,
    parse_configs,
    running_mean,
)
from pytest_qaccuracy.analysis.deadline import Deadline, DeadlineReached
from pytest_qaccuracy.analysis.partial import QdqGraph
from pytest_qaccuracy.analysis.reference_cache import REFERENCE_BUDGET, ReferenceBudget, ReferenceCache
from pytest_qaccuracy.analysis.results import SCHEMA_VERSION, ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.analysis.sensitivity import open_session
from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport, analyse_pair
from pytest_qaccuracy.analysis.slices import VIEW_TOLERANCES, SliceSpec, check_outputs, check_slices, parse_view
from pytest_qaccuracy.analysis.sweep import SweepResult, SweepStep, Target, sweep_in
from pytest_qaccuracy.analysis.task import evaluate_task_metrics
from pytest_qaccuracy.analysis.task_sweep import task_sweep
from pytest_qaccuracy.data import load_dataset
from pytest_qaccuracy.data.binding import Batch
from pytest_qaccuracy.data.progress import reporting
from pytest_qaccuracy.errors import DataError, InputError, ModelError
from pytest_qaccuracy.metrics import get_metric
from pytest_qaccuracy.metrics.channels import ChannelReport
from pytest_qaccuracy.metrics.task import TaskSpec
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions
from tests import modelzoo

CHANNELS = ChannelReport(axis=1, scale=0.5, min_steps=1.5, max_steps=200.0, low="0..1", flagged=True)


# ---------------------------------------------------------------- results.py


def test_an_output_writes_only_what_it_has() -> None:
    bare = OutputResult("out", {"cosine": 0.5, "mse": None})
    assert bare.to_dict() == {"name": "out", "metrics": {"cosine": 0.5, "mse": None}}
    # the quantized tensor is written only when it is another name than the output's
    assert OutputResult("out", {}, quantized_tensor="out").to_dict() == {"name": "out", "metrics": {}}
    full = OutputResult(
        "out",
        {"cosine": float("nan"), "sqnr": float("inf"), "mse": 2},
        undefined={"cosine": "all-zero reference"},
        worst_records={"mse": [(np.int64(3), np.float32(0.25)), (1, 0.125)]},
        quantized_tensor="out_q",
        channels=CHANNELS,
    )
    data = full.to_dict()
    assert list(data) == ["name", "metrics", "quantized_tensor", "undefined", "worst_records", "channels"]
    assert data["metrics"] == {"cosine": None, "sqnr": None, "mse": 2.0}
    assert data["quantized_tensor"] == "out_q"
    assert data["undefined"] == {"cosine": "all-zero reference"}
    rows = data["worst_records"]["mse"]
    assert rows == [[3, 0.25], [1, 0.125]]
    assert [type(x) for row in rows for x in row] == [int, float, int, float]
    assert data["channels"] == {
        "axis": 1,
        "scale": 0.5,
        "min_steps": 1.5,
        "max_steps": 200.0,
        "low": "0..1",
        "flagged": True,
    }
    json.dumps(data, allow_nan=False)


def test_an_output_reads_back_with_its_defaults() -> None:
    back = OutputResult.from_dict({"name": "out", "metrics": {"cosine": 1, "mse": None}})
    assert back == OutputResult("out", {"cosine": 1, "mse": None})
    assert back.undefined == {} and back.worst_records == {} and back.quantized_tensor is None
    assert back.channels is None
    full = OutputResult(
        "out",
        {"cosine": 0.5},
        undefined={"mse": "why"},
        worst_records={"cosine": [(3, 0.25)]},
        quantized_tensor="out_q",
        channels=CHANNELS,
    )
    again = OutputResult.from_dict(json.loads(json.dumps(full.to_dict())))
    assert again == full
    assert again.worst_records == {"cosine": [(3, 0.25)]}
    assert type(again.worst_records["cosine"][0]) is tuple
    # an empty channels entry reads as none
    assert OutputResult.from_dict({"name": "o", "metrics": {}, "channels": {}}).channels is None


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ([1.0], "output 'out': 'metrics' is not an object"),
        ({"cosine": True}, "output 'out', metric 'cosine': True is not a number"),
        ({"cosine": 1.0, "mse": "0.5"}, "output 'out', metric 'mse': '0.5' is not a number"),
        ({"mse": [1]}, "output 'out', metric 'mse': [1] is not a number"),
    ],
)
def test_output_metrics_that_are_not_numbers_are_refused(metrics, message: str) -> None:
    with pytest.raises(ValueError) as err:
        OutputResult.from_dict({"name": "out", "metrics": metrics})
    assert str(err.value) == message


def _layer(**kwargs) -> LayerResult:
    base = {
        "tensor": "conv1",
        "quantized_tensor": "conv1_q",
        "node": "Conv_0",
        "op_type": "Conv",
        "order": 2,
        "metrics": {"cosine": 0.75},
    }
    return LayerResult(**{**base, **kwargs})


def test_a_layer_writes_its_fields_in_order_and_optional_ones_when_set() -> None:
    assert _layer().to_dict() == {
        "tensor": "conv1",
        "quantized_tensor": "conv1_q",
        "node": "Conv_0",
        "op_type": "Conv",
        "order": 2,
        "metrics": {"cosine": 0.75},
        "matched_by": "name",
    }
    data = _layer(
        scale=np.float32(0.5), undefined={"sqnr": "zero"}, channels=CHANNELS, matched_by="structure"
    ).to_dict()
    assert list(data)[-4:] == ["matched_by", "scale", "undefined", "channels"]
    assert data["matched_by"] == "structure" and data["scale"] == 0.5 and type(data["scale"]) is float
    assert data["undefined"] == {"sqnr": "zero"} and data["channels"] == CHANNELS.to_dict()
    # a scale of 0 is still a scale
    assert _layer(scale=0.0).to_dict()["scale"] == 0.0


def test_a_layer_reads_back_with_its_defaults_and_refuses_bad_metrics() -> None:
    data = {"tensor": "t", "quantized_tensor": "tq", "order": "7", "metrics": {"mse": 0.5}}
    back = LayerResult.from_dict(data)
    assert back == LayerResult("t", "tq", None, None, 7, {"mse": 0.5})
    assert back.matched_by == "name" and back.scale is None and back.undefined == {} and back.channels is None
    layer = _layer(scale=0.25, undefined={"sqnr": "zero"}, channels=CHANNELS, matched_by="structure")
    assert LayerResult.from_dict(json.loads(json.dumps(layer.to_dict()))) == layer
    with pytest.raises(ValueError) as err:
        LayerResult.from_dict({**data, "metrics": {"mse": False}})
    assert str(err.value) == "layer 't', metric 'mse': False is not a number"


def _comparison(**kwargs) -> ComparisonResult:
    base = {
        "fp32_model": "a.onnx",
        "quantized_model": "b.onnx",
        "data": "d.h5",
        "records": 4,
        "metric_definitions": {"cosine": "cos", "mse": "mean sq"},
        "outputs": [OutputResult("y", {"cosine": 0.5}), OutputResult("z", {"cosine": 0.25})],
        "layers": [_layer()],
    }
    return ComparisonResult(**{**base, **kwargs})


def test_a_comparison_names_its_metrics_and_finds_its_outputs() -> None:
    result = _comparison()
    assert result.metric_names == ["cosine", "mse"]
    assert result.output("z").metrics == {"cosine": 0.25}
    assert result.output("y").metrics == {"cosine": 0.5}
    with pytest.raises(KeyError) as err:
        result.output("w")
    assert err.value.args[0] == "no output 'w'; outputs are ['y', 'z']"


def test_a_comparison_writes_the_documented_json() -> None:
    result = _comparison(
        unmatched_fp32=["f"],
        unmatched_quantized=["q1", "q2"],
        backend="integer",
        scheme="tflite",
        capture="float",
        higher_is_better={"cosine": True},
        reduction="numpy: no reduction graph",
    )
    assert result.to_dict() == {
        "schema_version": 1,
        "fp32_model": "a.onnx",
        "quantized_model": "b.onnx",
        "data": "d.h5",
        "records": 4,
        "backend": "integer",
        "scheme": "tflite",
        "capture": "float",
        "metric_definitions": {"cosine": "cos", "mse": "mean sq"},
        "higher_is_better": {"cosine": True},
        "outputs": [{"name": "y", "metrics": {"cosine": 0.5}}, {"name": "z", "metrics": {"cosine": 0.25}}],
        "layers": [_layer().to_dict()],
        "unmatched": {"fp32": ["f"], "quantized": ["q1", "q2"]},
        "reduction": "numpy: no reduction graph",
    }
    assert list(result.to_dict()) == [
        "schema_version",
        "fp32_model",
        "quantized_model",
        "data",
        "records",
        "backend",
        "scheme",
        "capture",
        "metric_definitions",
        "higher_is_better",
        "outputs",
        "layers",
        "unmatched",
        "reduction",
    ]
    assert ComparisonResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_a_comparison_reads_back_with_its_defaults() -> None:
    data = {
        "schema_version": 1,
        "fp32_model": "a.onnx",
        "quantized_model": "b.onnx",
        "data": "d.h5",
        "records": "4",
        "metric_definitions": {"cosine": "cos"},
        "outputs": [{"name": "y", "metrics": {"cosine": 0.5}}],
        "layers": [],
    }
    back = ComparisonResult.from_dict(data)
    assert back.records == 4 and back.outputs == [OutputResult("y", {"cosine": 0.5})] and back.layers == []
    assert back.unmatched_fp32 == [] and back.unmatched_quantized == []
    assert back.backend == "onnxruntime" and back.scheme is None and back.capture == "deployed"
    assert back.higher_is_better == {} and back.reduction is None and back.schema_version == SCHEMA_VERSION == 1
    partial = ComparisonResult.from_dict({**data, "unmatched": {"quantized": ["q"]}})
    assert partial.unmatched_fp32 == [] and partial.unmatched_quantized == ["q"]
    partial = ComparisonResult.from_dict({**data, "unmatched": {"fp32": ["f"]}})
    assert partial.unmatched_fp32 == ["f"] and partial.unmatched_quantized == []


@pytest.mark.parametrize(("version", "shown"), [(2, "2"), (None, "None"), ("1", "'1'")])
def test_another_schema_version_is_refused(version, shown: str) -> None:
    data = _comparison().to_dict()
    data["schema_version"] = version
    with pytest.raises(ValueError) as err:
        ComparisonResult.from_dict(data)
    assert str(err.value) == f"unsupported comparison schema_version {shown}"
    del data["schema_version"]
    with pytest.raises(ValueError, match=r"^unsupported comparison schema_version None$"):
        ComparisonResult.from_dict(data)


# ---------------------------------------------------------------- slices.py


@pytest.mark.parametrize(
    ("text", "output", "index"),
    [
        ("output0[:, 4:]", "output0", (slice(None), slice(4, None))),
        ("output0[:, 0:4]", "output0", (slice(None), slice(0, 4))),
        ("  out [ : , -3 ]  ", "out", (slice(None), -3)),
        ("out[:, 1:7:2, ...]", "out", (slice(None), slice(1, 7, 2), Ellipsis)),
        ("out[:, ::-1]", "out", (slice(None), slice(None, None, -1))),
        ("out[:, :5:]", "out", (slice(None), slice(None, 5, None))),
        ("a.b[x][:, 2]", "a.b[x]", (slice(None), 2)),
        ("out[:]", "out", (slice(None),)),
    ],
)
def test_views_parse_as_numpy_indices(text: str, output: str, index: tuple) -> None:
    assert parse_view(text) == (output, index)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("output0", "'output0' is not '<output>[<index>, ...]' (e.g. 'output0[:, 4:]')"),
        ("[:, 1]", "'[:, 1]' is not '<output>[<index>, ...]' (e.g. 'output0[:, 4:]')"),
        ("out[:, 1", "'out[:, 1' is not '<output>[<index>, ...]' (e.g. 'output0[:, 4:]')"),
        ("out[:, a]", "'out[:, a]': each index is ':', 'a:b', 'a:b:c', an integer or '...'"),
        ("out[:, 1:2:3:4]", "'out[:, 1:2:3:4]': each index is ':', 'a:b', 'a:b:c', an integer or '...'"),
        ("out[:, 1.5]", "'out[:, 1.5]': each index is ':', 'a:b', 'a:b:c', an integer or '...'"),
        ("out[:, ]", "'out[:, ]': each index is ':', 'a:b', 'a:b:c', an integer or '...'"),
        ("out[0, :]", "'out[0, :]': the first index is the record axis and must be ':'"),
        ("out[1:, :]", "'out[1:, :]': the first index is the record axis and must be ':'"),
        ("out[..., 1]", "'out[..., 1]': the first index is the record axis and must be ':'"),
    ],
)
def test_bad_views_say_why_in_full(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_view(text)
    assert str(err.value) == message


def test_a_view_takes_its_part_of_a_batch_and_names_a_misfit() -> None:
    spec = SliceSpec("scores", "out[:, 4:, ...]")
    assert spec.output == "out" and spec.index == (slice(None), slice(4, None), Ellipsis)
    batch = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    np.testing.assert_array_equal(spec.take(batch), batch[:, 4:])
    single = SliceSpec("one", "out[:, 5]")
    np.testing.assert_array_equal(single.take(batch), batch[:, 5, :])
    far = SliceSpec("far", "out[:, 6]")
    with pytest.raises(ValueError) as err:
        far.take(batch)
    assert str(err.value).startswith("slice 'far' (out[:, 6]) does not fit shape (2, 6, 3): index 6 is out of bounds")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def _tolerance(key: str, value: object) -> float:
    """A stand-in for the plugin's tolerance check: a number in [0, 1] or 'key: ...' why not."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{key}: expected a number in [0, 1], got {value!r}")
    return float(value) / 2  # the checked value, told apart from the given one


def test_slices_tables_give_specs_with_their_tolerances_and_rules() -> None:
    found = check_slices(
        {
            "boxes": " out[:, 0:4] ",
            7: {"view": "out[:, 4:]", "min_cosine": 1, "max_lsb": 0.5, "rules": ["sqnr>=10", "mse<=1"]},
        },
        _tolerance,
    )
    assert list(found) == ["boxes", "7"]
    assert found["boxes"] == SliceSpec("boxes", "out[:, 0:4]", (), ())
    assert found["7"] == SliceSpec("7", "out[:, 4:]", (("min_cosine", 0.5), ("max_lsb", 0.25)), ("sqnr>=10", "mse<=1"))
    assert check_slices({}) == {}
    assert VIEW_TOLERANCES == ("min_cosine", "min_sqnr", "max_lsb", "min_channel_steps")
    every = {key: 1 for key in VIEW_TOLERANCES}
    assert check_slices({"s": {"view": "o[:]", **every}}, _tolerance)["s"].tolerances == tuple(
        (key, 0.5) for key in VIEW_TOLERANCES
    )


KNOWN = "view, rules, min_cosine, min_sqnr, max_lsb, min_channel_steps"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["out[:, 1]"], 'slices: expected a table of name = "<output>[<index>, ...]"'),
        ("out[:, 1]", 'slices: expected a table of name = "<output>[<index>, ...]"'),
        ({"s": 3}, 'slices.s: expected a view string or a table with view = "<output>[...]"'),
        ({"s": {"rules": []}}, 'slices.s: expected a view string or a table with view = "<output>[...]"'),
        ({"s": {"view": 3}}, 'slices.s: expected a view string or a table with view = "<output>[...]"'),
        ({"s": "out"}, "slices.s: 'out' is not '<output>[<index>, ...]' (e.g. 'output0[:, 4:]')"),
        ({"s": {"view": "o[1, 2]"}}, "slices.s: 'o[1, 2]': the first index is the record axis and must be ':'"),
        (
            {"s": {"view": "o[:]", "rules": "sqnr>=1"}},
            "slices.s.rules: expected a list of '<metric><op><value>' strings",
        ),
        (
            {"s": {"view": "o[:]", "rules": ["a>1", 2]}},
            "slices.s.rules: expected a list of '<metric><op><value>' strings",
        ),
        ({"s": {"view": "o[:]", "colour": 1}}, f"slices.s: unknown key 'colour' (known: {KNOWN})"),
        ({"s": {"view": "o[:]", "min_cosine": 2}}, "slices.s.min_cosine: expected a number in [0, 1], got 2"),
        (
            {"ok": "o[:]", "s": {"view": "o[:]", "max_lsb": "x"}},
            "slices.s.max_lsb: expected a number in [0, 1], got 'x'",
        ),
    ],
)
def test_bad_slices_name_the_slice_and_the_problem(value, message: str) -> None:
    with pytest.raises(ValueError) as err:
        check_slices(value, _tolerance)
    assert str(err.value) == message
    assert err.value.__cause__ is None


def test_without_a_tolerance_check_every_tolerance_key_is_unknown() -> None:
    with pytest.raises(ValueError) as err:
        check_slices({"s": {"view": "o[:]", "min_cosine": 0.5}})
    assert str(err.value) == f"slices.s: unknown key 'min_cosine' (known: {KNOWN})"
    assert check_slices({"s": {"view": "o[:]", "rules": []}}) == {"s": SliceSpec("s", "o[:]")}


def test_views_must_name_an_output_and_not_take_an_outputs_name() -> None:
    good = [SliceSpec("boxes", "out[:, :4]"), SliceSpec("scores", "out[:, 4:]")]
    assert check_outputs(good, ["out", "aux"]) is None
    with pytest.raises(ValueError) as err:
        check_outputs([*good, SliceSpec("x", "other[:, 1]")], ["out", "aux"])
    assert str(err.value) == "slice 'x': no output 'other' (outputs: out, aux)"
    with pytest.raises(ValueError) as err:
        check_outputs((SliceSpec("aux", "out[:, 1]"),), ["out", "aux"])
    assert str(err.value) == "slice 'aux': an output has this name; name the view differently"


# ---------------------------------------------------------------- deadline.py


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_deadline_is_its_budget_from_now_and_passes_on_the_dot() -> None:
    clock = Clock(100.0)
    deadline = Deadline.after(2.5, clock)
    assert (deadline.at, deadline.seconds) == (102.5, 2.5)
    assert deadline.left() == 2.5
    deadline.check()
    clock.now = 102.25
    assert deadline.left() == 0.25
    deadline.check()
    deadline_module.check(deadline)
    clock.now = 102.5  # on the dot: passed
    with pytest.raises(DeadlineReached) as err:
        deadline.check()
    assert str(err.value) == "the budget of 2.5s ran out"
    with pytest.raises(DeadlineReached):
        deadline_module.check(deadline)
    clock.now = 103.0
    assert deadline.left() == -0.5
    deadline_module.check(None)  # no deadline: nothing to check


def test_the_budget_is_shown_with_three_digits_and_the_clock_is_not_compared() -> None:
    with pytest.raises(DeadlineReached) as err:
        Deadline(0.0, 1234.5, Clock(0.0)).check()
    assert str(err.value) == "the budget of 1.23e+03s ran out"
    assert Deadline(1.0, 2.0, Clock(5.0)) == Deadline(1.0, 2.0, Clock(9.0))
    assert Deadline(1.0, 2.0).clock is time.monotonic
    before = time.monotonic()
    real = Deadline.after(60.0)
    assert before + 60.0 <= real.at <= time.monotonic() + 60.0 and real.clock is time.monotonic
    assert 0 < real.left() <= 60.0


# ---------------------------------------------------------------- sweep.py: the target and sentences


@pytest.mark.parametrize(
    ("text", "metric", "value"),
    [
        ("cosine>=0.999", "cosine", 0.999),
        ("  mse <= 1e-4 ", "mse", 1e-4),
        ("cosine=0.5", "cosine", 0.5),
        ("mse=+2E-3", "mse", 2e-3),
        ("sqnr>=-3", "sqnr", -3.0),
    ],
)
def test_targets_parse(text: str, metric: str, value: float) -> None:
    assert Target.parse(text) == Target(metric, value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cosine", "target 'cosine': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        ("", "target '': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        (None, "target None: expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        ("Cosine>=1", "target 'Cosine>=1': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        ("cosine>0.9", "target 'cosine>0.9': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        # the characters of a number that are not one (was a bare ValueError: a traceback in the CLI)
        ("cosine>=1e", "target 'cosine>=1e': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        ("mse<=..5", "target 'mse<=..5': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        ("mse<=-", "target 'mse<=-': expected METRIC>=VALUE or METRIC<=VALUE, e.g. cosine>=0.999"),
        ("cosine<=0.9", "target 'cosine<=0.9': cosine is better when higher; write cosine >= 0.9"),
        ("mse>=0.25", "target 'mse>=0.25': mse is better when lower; write mse <= 0.25"),
    ],
)
def test_bad_targets_say_how_to_write_them(text, message: str) -> None:
    with pytest.raises(InputError) as err:
        Target.parse(text)
    assert str(err.value) == message


def test_a_target_is_met_in_its_metrics_direction_on_the_bound() -> None:
    high, low = Target("cosine", 0.5), Target("mse", 0.5)
    assert high.higher_is_better is True and low.higher_is_better is False
    assert high.met(0.5) and high.met(0.75) and not high.met(0.25)
    assert low.met(0.5) and low.met(0.25) and not low.met(0.75)
    assert not high.met(None) and not low.met(None)
    assert str(high) == "cosine >= 0.5" and str(Target("mse", 1e-4)) == "mse <= 0.0001"


def _sweep(**kwargs) -> SweepResult:
    base = {
        "fp32_model": "a.onnx",
        "quantized_model": "b.onnx",
        "data": "d.h5",
        "records": 3,
        "ranking_mode": "single",
        "ranking_metric": "cosine",
        "steps": [SweepStep(0, [], {"cosine": 0.5}), SweepStep(1, ["n1"], {"cosine": 0.75})],
    }
    return SweepResult(**{**base, **kwargs})


def test_the_suggestion_is_written_as_quantize_statics_argument_or_a_sentence_why_not() -> None:
    assert _sweep().nodes_to_exclude() == "no target given"
    target = Target("cosine", 0.9)
    assert _sweep(target=target, suggestion=["n1", "n2"]).nodes_to_exclude() == "nodes_to_exclude=['n1', 'n2']"
    assert _sweep(target=target, suggestion=[]).nodes_to_exclude() == "nodes_to_exclude=[]"
    assert (
        _sweep(target=target).nodes_to_exclude() == "no exclusion list up to 1 node(s) meets cosine >= 0.9 (best: 0.75)"
    )
    other = Target("mse", 0.1)
    assert _sweep(target=other).nodes_to_exclude() == "no exclusion list up to 1 node(s) meets mse <= 0.1 (best: None)"
    assert _sweep(target=target, steps=[]).nodes_to_exclude() == (
        "no exclusion list up to -1 node(s) meets cosine >= 0.9 (best: None)"
    )


def test_a_sweep_document_names_its_kind() -> None:
    sweep = _sweep(target=Target("cosine", 0.9), suggestion=["n1"])
    data = sweep.to_dict()
    assert (data["schema_version"], data["kind"]) == (1, "sweep")
    assert list(data)[:3] == ["schema_version", "kind", "fp32_model"]
    assert SweepResult.from_dict(json.loads(json.dumps(data))) == sweep
    with pytest.raises(ValueError, match="not a sweep result"):
        SweepResult.from_dict({**data, "kind": "cumulative"})


# ---------------------------------------------------------------- cumulative.py: the helpers


def test_running_mean_skips_undefined_points() -> None:
    nan, inf = float("nan"), float("inf")
    assert running_mean([]) == []
    assert running_mean([None, nan, 2.0, inf, 4.0, None, 0.0]) == [None, None, 2.0, 2.0, 3.0, 3.0, 2.0]
    assert running_mean([-1.0, 1.0]) == [-1.0, 0.0]


def test_configurations_from_node_lists() -> None:
    configs = parse_configs([["a", "b"], ["c"]], [["d"], ["e", "f"]])
    assert configs == [
        PartialConfig("quantize a,b", quantize=("a", "b")),
        PartialConfig("quantize c", quantize=("c",)),
        PartialConfig("all but d", exclude=("d",)),
        PartialConfig("all but e,f", exclude=("e", "f")),
    ]
    assert parse_configs() == []
    assert configs[0].exclude == () and configs[0].kind == "node" and configs[2].quantize is None
    assert (
        PartialConfig("fully quantized", None, (), "node"),
        PartialConfig("weights only", None, (), "weight"),
        PartialConfig("activations only", None, (), "activation"),
    ) == DEFAULT_CONFIGS
    assert KINDS == ("node", "weight", "activation")


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(InputError) as err:
        PartialConfig("mine", kind="bias").edges(None)
    assert str(err.value) == "configuration 'mine': unknown kind 'bias'; expected node, weight, activation"


# ---------------------------------------------------------------- sensitivity_report.py: the document


def test_a_sensitivity_report_document_and_its_refusals() -> None:
    report = SensitivityReport("net", unsupported="QOperator model")
    assert report.to_dict() == {"schema_version": 1, "stem": "net", "unsupported": "QOperator model"}
    assert SensitivityReport("net").to_dict() == {"schema_version": 1, "stem": "net"}
    stopped = SensitivityReport("net", stopped="no sweep")
    assert SensitivityReport.from_dict(stopped.to_dict()) == stopped
    assert SensitivityReport.from_dict({"schema_version": 1, "stem": "s"}) == SensitivityReport("s")
    for data in ({"stem": "net"}, {"schema_version": 2, "stem": "net"}, {"schema_version": 1}):
        with pytest.raises(ValueError) as err:
            SensitivityReport.from_dict(data)
        assert str(err.value) == "not a sensitivity report (schema_version 1 with a 'stem')"


def test_as_mapping_is_label_to_values() -> None:
    curves = [CumulativeCurve("a", None, [], "node", [1.0, None]), CumulativeCurve("b", ["x"], ["y"], "weight", [])]
    result = CumulativeResult("f", "q", "d", 2, "mse", "f", False, True, ["n1", "n2"], ["Conv", "Add"], curves)
    assert as_mapping(result) == {"a": [1.0, None], "b": []}
    assert result.chart_data() == {
        "title": "cumulative mse (running mean)",
        "x_label": "node (topological order)",
        "y_label": "mse",
        "x": ["n1", "n2"],
        "series": [{"name": "a", "y": [1.0, None]}, {"name": "b", "y": []}],
    }
    plain = CumulativeResult("f", "q", "d", 2, "mse", "f", False, False, [], [], [])
    assert plain.chart_data()["title"] == "cumulative mse"
    data = result.to_dict()
    assert (data["schema_version"], data["kind"]) == (1, "cumulative")
    assert CumulativeResult.from_dict(json.loads(json.dumps(data))) == result


# ---------------------------------------------------------------- task.py and task_sweep.py
#
# The task metric is the built-in binary F1 on the zoo's logits, a logit >= 0 being a positive
# decision: f1 = 2 TP / (2 TP + FP + FN) over every element (docs/task-metrics.md), worked below from
# onnxruntime's own runs of each model.

F1 = {"metric": "binary_f1", "output": "logits", "threshold": 0.0}
F1_SPEC = TaskSpec("binary_f1", json.dumps({"output": "logits", "threshold": 0.0}, sort_keys=True))


def _records(count: int = 12) -> np.ndarray:
    """The zoo's data file's records (written from these very inputs), as one batch."""
    return modelzoo.random_inputs(12, seed=4)[:count, 0]


def _logits(model: Path | bytes, count: int = 12) -> np.ndarray:
    session = ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"]
    )
    return session.run(["logits"], {"x": _records(count)})[0]


def _f1(predicted: np.ndarray, truth: np.ndarray) -> float | None:
    tp = int(np.sum(predicted & truth))
    fp = int(np.sum(predicted & ~truth))
    fn = int(np.sum(~predicted & truth))
    return None if 2 * tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def _targets(count: int = 12) -> list[list[int]]:
    """Hand-made targets: record r's class c is positive when (r + c) is divisible by 3."""
    return [[int((r + c) % 3 == 0) for c in range(10)] for r in range(count)]


class OpenedAndClosed:
    """load_dataset as the task modules call it, counting the datasets it opened that were closed."""

    def __init__(self, monkeypatch, module) -> None:
        self.opened, self.closed = 0, 0
        monkeypatch.setattr(module, "load_dataset", self)

    def __call__(self, path):
        dataset = load_dataset(path)
        self.opened += 1
        close = dataset.close

        def counted() -> None:
            self.closed += 1
            close()

        dataset.close = counted
        return dataset


def test_task_metrics_of_a_pair_are_scored_against_the_fp32_decisions(zoo, monkeypatch) -> None:
    closes = OpenedAndClosed(monkeypatch, task_module)
    found = evaluate_task_metrics(zoo["fp32"], zoo["qdq_u8"], zoo["data"], [F1])
    assert list(found) == ["f1"]
    value = found["f1"]
    f, q = _logits(zoo["fp32"]) >= 0, _logits(zoo["qdq_u8"]) >= 0
    assert value.against == "fp32" and value.records == 12 and value.higher_is_better is True
    assert value.fp32 == 1.0
    assert value.quantized == pytest.approx(_f1(q, f), abs=1e-12)
    assert (closes.opened, closes.closed) == (1, 1)  # a path it opened, it closes


def test_task_metrics_take_targets_as_a_list_or_a_sidecar_file(zoo, tmp_path, monkeypatch) -> None:
    truth = np.asarray(_targets(), bool)
    f, q = _logits(zoo["fp32"]) >= 0, _logits(zoo["qdq_u8"]) >= 0
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    dataset = load_dataset(zoo["data"])
    closes = OpenedAndClosed(monkeypatch, task_module)
    listed = evaluate_task_metrics(pair, None, dataset, [F1_SPEC], targets=_targets())["f1"]
    assert closes.opened == 0 and len(dataset) == 12  # a dataset given stays open: it is the caller's
    assert next(dataset.iter_records(0, 1)) is not None
    dataset.close()
    assert listed.against == "targets"
    assert listed.fp32 == pytest.approx(_f1(f, truth), abs=1e-12)
    assert listed.quantized == pytest.approx(_f1(q, truth), abs=1e-12)
    sidecar = tmp_path / "targets.jsonl"
    lines = [json.dumps({"record": r, "target": t}) for r, t in reversed(list(enumerate(_targets())))]
    sidecar.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for given in (sidecar, str(sidecar)):
        read = evaluate_task_metrics(str(zoo["fp32"]), zoo["qdq_u8"], zoo["data"], ["binary_f1"], targets=given)
        # the default output is the first, the logits, and the default threshold 0.5
        assert read["f1"].fp32 == pytest.approx(_f1(_logits(zoo["fp32"]) >= 0.5, truth), abs=1e-12)
        assert read["f1"].quantized == pytest.approx(_f1(_logits(zoo["qdq_u8"]) >= 0.5, truth), abs=1e-12)
    assert (closes.opened, closes.closed) == (2, 2)


def test_task_metric_errors_are_one_input_error_and_the_data_is_closed(zoo, tmp_path, monkeypatch) -> None:
    with pytest.raises(InputError) as err:
        evaluate_task_metrics(zoo["fp32"], zoo["qdq_u8"], zoo["data"], ["nosuchmodule_xyz:Metric"])
    assert str(err.value).startswith("task metric 'nosuchmodule_xyz:Metric': cannot import 'nosuchmodule_xyz' (")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    with pytest.raises(InputError) as err:
        evaluate_task_metrics(zoo["fp32"], zoo["qdq_u8"], zoo["data"], [F1, F1])
    assert str(err.value) == (
        "task metrics 'binary_f1(output='logits', threshold=0.0)' and "
        "'binary_f1(output='logits', threshold=0.0)' both compute 'f1'"
    )
    closes = OpenedAndClosed(monkeypatch, task_module)
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"record": 12, "target": [0] * 10}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"record 12 is not in the data \(records 0..11\)"):
        evaluate_task_metrics(zoo["fp32"], zoo["qdq_u8"], zoo["data"], [F1], targets=short)
    assert (closes.opened, closes.closed) == (1, 1)


def test_task_metrics_pass_the_runtime_choices_on(zoo, monkeypatch) -> None:
    calls = []

    def recorder(pair, dataset, **kwargs):
        calls.append((pair, len(dataset), kwargs))
        raise RuntimeError("recorded")

    monkeypatch.setattr(task_module, "measure_outputs", recorder)
    options = RuntimeOptions(batch_size=3)
    with pytest.raises(RuntimeError, match="recorded"):
        evaluate_task_metrics(
            zoo["fp32"], zoo["qdq_u8"], zoo["data"], [F1], [1] * 12, options, backend="integer", scheme="tflite"
        )
    ((pair, records, kwargs),) = calls
    assert pair.fp32_path == Path(zoo["fp32"]) and pair.quantized_path == Path(zoo["qdq_u8"]) and records == 12
    assert kwargs == {
        "options": options,
        "backend": "integer",
        "scheme": "tflite",
        "tasks": (F1_SPEC,),
        "targets": [1] * 12,
    }


def _order(pair: ModelPair) -> list[str]:
    return [n.name for n in QdqGraph(pair.quantized, pair.fp32, "net").nodes]


def test_task_sweep_step_zero_is_the_quantized_model_and_each_tolerance_kind_meets_on_its_bound(
    zoo, damaged, monkeypatch
) -> None:
    pair = ModelPair(zoo["fp32"], damaged)
    order = _order(pair)
    q = _f1(_logits(damaged) >= 0, _logits(zoo["fp32"]) >= 0)
    assert q is not None and q < 1.0
    closes = OpenedAndClosed(monkeypatch, task_sweep_module)
    for check, threshold in (("min:f1", q), ("max:f1", q), ("max_drop:f1", 1.0 - q)):
        sweep = task_sweep(pair, zoo["data"], F1_SPEC, check, threshold, order)
        assert (sweep.check, sweep.threshold, sweep.records, sweep.suggestion) == (check, threshold, 12, [])
        assert len(sweep.steps) == 1 and sweep.steps[0]["excluded"] == []
        assert sweep.steps[0]["quantized"] == pytest.approx(q, abs=1e-12)
        assert sweep.steps[0]["drop"] == pytest.approx(1.0 - q, abs=1e-12)
    assert (closes.opened, closes.closed) == (3, 3)
    # just past each bound: not met at k = 0 (and never, with no node to keep in float)
    for check, threshold in (("min:f1", q + 1e-9), ("max:f1", q - 1e-9), ("max_drop:f1", 1.0 - q - 1e-9)):
        sweep = task_sweep(pair, zoo["data"], F1_SPEC, check, threshold, order, max_excluded=0)
        assert sweep.suggestion is None and len(sweep.steps) == 1 and sweep.steps[0]["excluded"] == []


def test_task_sweep_keeps_nodes_in_float_until_the_value_is_met(zoo, damaged) -> None:
    pair = ModelPair(zoo["fp32"], damaged)
    order = _order(pair)
    everything = task_sweep(pair, zoo["data"], F1_SPEC, "min:f1", 2.0, order, max_excluded=len(order) + 5)
    assert everything.suggestion is None and everything.records == 12
    assert [s["excluded"] for s in everything.steps] == [order[:k] for k in range(len(order) + 1)]
    # every node kept in float: the fp32 model, whose decisions are the truth
    assert everything.steps[-1]["quantized"] == 1.0 and everything.steps[-1]["drop"] == 0.0
    met = task_sweep(pair, zoo["data"], F1_SPEC, "min:f1", 1.0, order, max_excluded=len(order))
    k = len(met.suggestion)
    assert met.steps[-1]["excluded"] == met.suggestion == order[:k] and len(met.steps) == k + 1
    assert met.steps[-1]["quantized"] == 1.0 and all(s["quantized"] < 1.0 for s in met.steps[:-1])
    assert met.steps == everything.steps[: k + 1]
    two = task_sweep(pair, zoo["data"], F1_SPEC, "min:f1", 2.0, order, max_excluded=2)
    assert [s["excluded"] for s in two.steps] == [[], order[:1], order[:2]]
    assert two.steps == everything.steps[:3] and two.to_dict()["suggestion"] is None
    assert two.to_dict() == {"check": "min:f1", "threshold": 2.0, "records": 12, "steps": two.steps, "suggestion": None}


def test_task_sweep_on_the_first_records_with_targets(zoo, damaged) -> None:
    pair = ModelPair(zoo["fp32"], damaged)
    dataset = load_dataset(zoo["data"])
    truth = np.asarray(_targets(5), bool)
    sweep = task_sweep(
        pair, dataset, F1_SPEC, "min:f1", 2.0, _order(pair), targets=_targets(), records=5, max_excluded=0
    )
    assert sweep.records == 5 and len(dataset) == 12
    assert next(dataset.iter_records(0, 1)) is not None  # the caller's dataset stays open
    dataset.close()
    fp32, quantized = _f1(_logits(zoo["fp32"], 5) >= 0, truth), _f1(_logits(damaged, 5) >= 0, truth)
    assert sweep.steps[0]["quantized"] == pytest.approx(quantized, abs=1e-12)
    assert sweep.steps[0]["drop"] == pytest.approx(fp32 - quantized, abs=1e-12)


def test_task_sweep_never_meets_an_undefined_value_and_refuses_a_qoperator_model(zoo, damaged) -> None:
    pair = ModelPair(zoo["fp32"], damaged)
    never = TaskSpec("binary_f1", json.dumps({"output": "logits", "threshold": 1e9}, sort_keys=True))
    for check, threshold in (("min:f1", -1.0), ("max:f1", 2.0), ("max_drop:f1", 2.0)):
        sweep = task_sweep(pair, zoo["data"], never, check, threshold, _order(pair), max_excluded=1)
        assert sweep.suggestion is None
        assert [(s["quantized"], s["drop"]) for s in sweep.steps] == [(None, None), (None, None)]
    with pytest.raises(ModelError):
        task_sweep(ModelPair(zoo["fp32"], zoo["qop_u8"]), zoo["data"], F1_SPEC, "min:f1", 1.0, ["conv1"])


# ---------------------------------------------------------------- sweep_in and analyse_pair, their plumbing
#
# The models are replaced by recorders: a graph whose edges are strings, a runner that returns
# hand-written output metrics per experiment, so every value the result holds is known in advance.


class FakeGraph:
    """Node ``n`` owns the edges ``n.a`` and ``n.b``; there is one more, ``other``."""

    def __init__(self, nodes: list[str]) -> None:
        self.all_edges = frozenset({"other", *(f"{n}.{e}" for n in nodes for e in "ab")})
        self.asked: list[tuple[tuple[str, ...], str]] = []

    def edges_of(self, nodes, kind: str) -> frozenset[str]:
        self.asked.append((tuple(nodes), kind))
        return frozenset(f"{n}.{e}" for n in nodes for e in "ab")


class FakeRunner:
    def __init__(self, results: list[dict]) -> None:
        self.results, self.calls = results, []

    def run(self, experiments, cache, deadline):
        self.calls.append((experiments, cache, deadline))
        return self.results[: len(experiments)]


class FakeSession:
    def __init__(self, nodes: list[str], results: list[dict], metrics=("cosine", "mse")) -> None:
        self.metrics = list(metrics)
        self.qgraph = FakeGraph(nodes)
        self.runner = FakeRunner(results)
        self.pair = SimpleNamespace(fp32_path=Path("m.onnx"), quantized_path=Path("m.qdq.onnx"))
        self.dataset = type("D", (), {"name": "data.h5"})()
        self.records = 7


class FakeRanking:
    mode, metric_names = "reuse", ["mse", "cosine"]

    def __init__(self, order: list[str]) -> None:
        self.order = order

    def ranked(self):
        return [type("N", (), {"node": n})() for n in self.order]


def _step_results() -> list[dict]:
    """Two outputs per step; each step's means worked by hand below."""
    return [
        {"y": {"cosine": 0.5, "mse": 4.0}, "z": {"cosine": 0.75, "mse": None}},  # 0.625, 4.0
        {"y": {"cosine": 0.875, "mse": 1.0}, "z": {"cosine": 0.875, "mse": 3.0}},  # 0.875, 2.0
        {"y": {"cosine": 1.0, "mse": 0.0}, "z": {"cosine": 0.96875, "mse": 0.5}},  # 0.984375, 0.25
        {"y": {"cosine": 1.0, "mse": 0.0}, "z": {"cosine": 1.0, "mse": 0.0}},  # 1.0, 0.0
    ]


def test_sweep_in_runs_one_experiment_per_prefix_and_suggests_the_first_that_meets() -> None:
    session = FakeSession(["c", "a", "b"], _step_results())
    deadline = Deadline(10.0, 10.0, Clock(0.0))
    result = sweep_in(session, FakeRanking(["c", "a", "b"]), 3, Target("cosine", 0.98), deadline)
    ((experiments, cache, given),) = session.runner.calls
    assert cache == "quantized" and given is deadline
    assert [e.label for e in experiments] == ["k=0", "k=1", "k=2", "k=3"]
    every = session.qgraph.all_edges
    assert experiments[0].enabled == every
    assert experiments[1].enabled == every - {"c.a", "c.b"}
    assert experiments[3].enabled == frozenset({"other"})
    assert session.qgraph.asked[1] == (("c",), "node")
    assert [(s.k, s.excluded) for s in result.steps] == [(0, []), (1, ["c"]), (2, ["c", "a"]), (3, ["c", "a", "b"])]
    assert [s.metrics for s in result.steps] == [
        {"cosine": 0.625, "mse": 4.0},
        {"cosine": 0.875, "mse": 2.0},
        {"cosine": 0.984375, "mse": 0.25},
        {"cosine": 1.0, "mse": 0.0},
    ]
    assert result.steps[0].outputs == _step_results()[0]
    assert result.suggestion == ["c", "a"] and result.target == Target("cosine", 0.98)
    assert (result.fp32_model, result.quantized_model, result.data, result.records) == (
        "m.onnx",
        "m.qdq.onnx",
        "data.h5",
        7,
    )
    assert (result.ranking_mode, result.ranking_metric) == ("reuse", "mse")
    # on the bound: met; a lower-is-better target
    assert sweep_in(session, FakeRanking(["c", "a", "b"]), 3, Target("cosine", 0.875)).suggestion == ["c"]
    assert sweep_in(session, FakeRanking(["c", "a", "b"]), 3, Target("mse", 2.0)).suggestion == ["c"]
    assert sweep_in(session, FakeRanking(["c", "a", "b"]), 3, Target("mse", 4.0)).suggestion == []


def test_sweep_in_limits_and_refusals() -> None:
    session = FakeSession(["c", "a", "b"], _step_results())
    assert len(sweep_in(session, FakeRanking(["c", "a", "b"]), None).steps) == 4  # None: every node
    assert len(sweep_in(session, FakeRanking(["c", "a", "b"]), 9).steps) == 4  # at most every node
    short = sweep_in(session, FakeRanking(["c", "a", "b"]), 1, Target("cosine", 0.99))
    assert len(short.steps) == 2 and short.suggestion is None
    assert sweep_in(session, FakeRanking(["c", "a", "b"]), 0).steps[0].excluded == []
    assert sweep_in(session, FakeRanking(["c", "a", "b"]), 3).suggestion is None  # no target: no suggestion
    assert session.runner.calls[-1][2] is None
    with pytest.raises(InputError) as err:
        sweep_in(session, FakeRanking(["c"]), -1)
    assert str(err.value) == "max_excluded must be >= 0, got -1"
    with pytest.raises(InputError) as err:
        sweep_in(session, FakeRanking(["c"]), 2, Target("sqnr", 10.0))
    assert str(err.value) == "target metric 'sqnr' is not among the measured metrics ['cosine', 'mse']"


class Analyses:
    """open_session, sensitivity_in, sweep_in and cumulative_in of sensitivity_report, recorded."""

    def __init__(self, monkeypatch, stopped=None, sweep_raises=False, curves_raise=False, open_raises=None) -> None:
        self.calls: list[tuple] = []
        self.closed = 0
        self.ranking = SimpleNamespace(stopped=stopped)
        self.sweep, self.curves = object(), object()
        self.sweep_raises, self.curves_raise, self.open_raises = sweep_raises, curves_raise, open_raises
        for name in ("open_session", "sensitivity_in", "sweep_in", "cumulative_in"):
            monkeypatch.setattr(report_module, name, getattr(self, name))

    def open_session(self, *args, **kwargs):
        self.calls.append(("open", args, kwargs))
        if self.open_raises is not None:
            raise self.open_raises
        return SimpleNamespace(close=self.close)

    def close(self) -> None:
        self.closed += 1

    def sensitivity_in(self, *args, **kwargs):
        self.calls.append(("rank", args[1:], kwargs))
        return self.ranking

    def sweep_in(self, *args):
        self.calls.append(("sweep", args[1:], {}))
        if self.sweep_raises:
            raise DeadlineReached("late")
        return self.sweep

    def cumulative_in(self, *args):
        self.calls.append(("curves", args[1:], {}))
        if self.curves_raise:
            raise DeadlineReached("late")
        return self.curves


def _pair(format: str = "qdq") -> SimpleNamespace:
    return SimpleNamespace(quantized_path=Path("/x/net.qdq.onnx"), format=format)


def test_analyse_pair_hands_every_choice_to_its_analyses(monkeypatch) -> None:
    seen = Analyses(monkeypatch)
    pair, options, reference, deadline = _pair(), RuntimeOptions(batch_size=2), object(), Deadline(1.0, 1.0)
    report = analyse_pair(
        pair,
        "d.h5",
        " mse , sqnr",
        "reuse",
        "cosine>=0.5",
        4,
        True,
        True,
        options,
        3,
        ["conv1"],
        reference,
        deadline,
    )
    assert seen.calls == [
        (
            "open",
            (pair, "d.h5", ["mse", "sqnr", "cosine"], options),
            {"records": 3, "outputs": ["conv1"], "reference": reference},
        ),
        ("rank", ("reuse",), {"deadline": deadline}),
        ("sweep", (seen.ranking, 4, Target("cosine", 0.5), deadline), {}),
        ("curves", (DEFAULT_CONFIGS, True, deadline), {}),
    ]
    assert seen.closed == 1
    assert report == SensitivityReport("net.qdq", seen.ranking, seen.sweep, seen.curves, stopped=None)


def test_analyse_pair_defaults(monkeypatch) -> None:
    seen = Analyses(monkeypatch)
    pair = _pair()
    report = analyse_pair(pair, "d.h5")
    assert seen.calls == [
        ("open", (pair, "d.h5", ["cosine"], None), {"records": None, "outputs": None, "reference": None}),
        ("rank", ("single",), {"deadline": None}),
        ("curves", (DEFAULT_CONFIGS, False, None), {}),
    ]
    assert report.sweep is None and report.cumulative is seen.curves and report.stopped is None
    seen.calls.clear()
    target = Target("mse", 0.25)  # a target given as one, its metric already measured
    report = analyse_pair(pair, "d.h5", ["mse", "cosine"], target=target, cumulative=False)
    assert seen.calls[0][1][2] == ["mse", "cosine"]
    assert seen.calls[2] == ("sweep", (seen.ranking, 10, target, None), {})
    assert len(seen.calls) == 3 and report.cumulative is None and report.sweep is seen.sweep


@pytest.mark.parametrize(
    ("stopped", "sweep_raises", "curves_raise", "expected"),
    [
        (None, True, False, "stopped at the budget; no sweep"),
        (None, False, True, "stopped at the budget; no cumulative curves"),
        (None, True, True, "stopped at the budget; no sweep; no cumulative curves"),
        (
            "ranking stopped after 2 of 5 nodes",
            True,
            True,
            "ranking stopped after 2 of 5 nodes; no sweep; no cumulative curves",
        ),
        ("ranking stopped after 2 of 5 nodes", False, False, "ranking stopped after 2 of 5 nodes"),
    ],
)
def test_analyse_pair_says_what_the_deadline_cut_short(
    monkeypatch, stopped, sweep_raises, curves_raise, expected
) -> None:
    seen = Analyses(monkeypatch, stopped, sweep_raises, curves_raise)
    report = analyse_pair(_pair(), "d.h5", target="cosine>=0.5")
    assert report.stopped == expected and seen.closed == 1
    assert report.sweep is (None if sweep_raises else seen.sweep)
    assert report.cumulative is (None if curves_raise else seen.curves)
    assert [c[0] for c in seen.calls] == ["open", "rank", "sweep", "curves"]


def test_analyse_pair_closes_its_session_and_reports_a_qoperator_pair(monkeypatch) -> None:
    seen = Analyses(monkeypatch)
    monkeypatch.setattr(seen, "ranking", None)

    def fails(*args, **kwargs):
        raise DeadlineReached("before any node")

    monkeypatch.setattr(report_module, "sensitivity_in", fails)
    with pytest.raises(DeadlineReached):
        analyse_pair(_pair(), "d.h5")
    assert seen.closed == 1
    refused = Analyses(monkeypatch, open_raises=ModelError("not a QDQ model: QLinearConv"))
    report = analyse_pair(_pair("qoperator"), "d.h5")
    assert report == SensitivityReport("net.qdq", unsupported="not a QDQ model: QLinearConv")
    with pytest.raises(ModelError, match="not a QDQ model"):
        analyse_pair(_pair("qdq"), "d.h5")
    assert refused.closed == 0


# ---------------------------------------------------------------- reference_cache.py, with hand-made batches


def _batch(start: int, count: int) -> Batch:
    return Batch(start, [{"x": np.zeros(1)} for _ in range(count)])


class Recompute:
    """A runner factory that counts the runners it made and the batches they ran."""

    def __init__(self) -> None:
        self.made, self.ran = 0, []

    def __call__(self):
        self.made += 1
        return self

    def run(self, batch: Batch) -> dict[str, np.ndarray]:
        self.ran.append((batch.start, len(batch)))
        return {"y": np.full(len(batch), -1.0)}


def test_a_budget_reserves_up_to_its_limit_inclusive() -> None:
    assert REFERENCE_BUDGET == 256 * 1024 * 1024
    assert ReferenceBudget().limit == REFERENCE_BUDGET and ReferenceBudget().used == 0
    assert ReferenceBudget(0).limit == 0
    budget = ReferenceBudget(100)
    assert budget.reserve(60) and budget.used == 60
    assert not budget.reserve(41) and budget.used == 60  # refused: nothing taken
    assert budget.reserve(40) and budget.used == 100  # exactly the limit fits
    budget.release(30)
    assert budget.used == 70
    assert ReferenceCache(["y"]).budget.limit == REFERENCE_BUDGET
    assert ReferenceCache(["y"], 64).budget.limit == 64
    assert ReferenceCache(["y"], budget).budget is budget


def test_a_cache_keeps_copies_of_whole_batches_and_recomputes_the_others() -> None:
    cache = ReferenceCache(["y", "z", "y"])
    assert cache.names == ("y", "z") and cache.records is None and cache.overflowed is False
    y, z = np.arange(4.0), np.ones((4, 2), np.float32)
    cache.add(_batch(0, 4), {"y": y, "z": z, "w": np.zeros(3)})
    cache.add(_batch(4, 4), {"y": y})  # z missing: a reduced layer, not kept
    y[0] = 99.0  # the pass's arrays may be reused: the cache holds copies
    assert cache.held_batches == 1 and cache.nbytes == 4 * 8 + 8 * 4 and cache.budget.used == cache.nbytes
    kept = cache.values(_batch(0, 4))
    assert set(kept) == {"y", "z"} and kept["y"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert cache.recomputed == 0
    with pytest.raises(RuntimeError) as err:
        cache.values(_batch(4, 4))
    assert str(err.value) == "no comparison began this cache"
    recompute = Recompute()
    cache.begin(["y", "z", "w"], recompute)
    assert cache.values(_batch(0, 3))["y"].tolist() == [-1.0] * 3  # same start, other length: not kept
    assert cache.values(_batch(4, 4))["y"].tolist() == [-1.0] * 4
    assert recompute.made == 1 and recompute.ran == [(0, 3), (4, 4)] and cache.recomputed == 2
    assert cache.values(_batch(0, 4))["y"][0] == 0.0 and cache.recomputed == 2


def test_a_cache_covers_what_the_pass_computed_and_it_keeps() -> None:
    cache = ReferenceCache(["y", "z"])
    assert not cache.covers(["y"])  # no pass began
    cache.begin(["y", "w"], Recompute())
    assert cache.covers(["y"]) and cache.covers([])
    assert not cache.covers(["z"])  # kept name, not computed by the pass
    assert not cache.covers(["w"])  # computed, not a kept name
    assert not cache.covers(["y", "z"])


def test_a_cache_keeps_only_batches_within_its_records() -> None:
    cache = ReferenceCache(["y"], records=6)
    cache.add(_batch(0, 4), {"y": np.zeros(4)})
    cache.add(_batch(4, 2), {"y": np.zeros(2)})  # ends on record 6: inside
    cache.add(_batch(6, 1), {"y": np.zeros(1)})
    cache.add(_batch(4, 4), {"y": np.zeros(4)})
    assert cache.held_batches == 2 and cache.nbytes == 6 * 8


def test_past_the_budget_a_cache_drops_everything_and_keeps_nothing_more() -> None:
    budget = ReferenceBudget(5 * 8)
    cache = ReferenceCache(["y"], budget)
    recompute = Recompute()
    cache.begin(["y"], recompute)
    cache.values(_batch(9, 1))
    assert cache._runner is not None
    cache.add(_batch(0, 4), {"y": np.zeros(4)})
    cache.add(_batch(4, 1), {"y": np.zeros(1)})  # exactly the budget
    assert cache.held_batches == 2 and budget.used == 40 and not cache.overflowed
    cache.add(_batch(5, 1), {"y": np.zeros(1)})
    assert cache.overflowed and cache.held_batches == 0 and cache.nbytes == 0 and budget.used == 0
    assert cache._runner is None  # released: a new runner is made on the next request
    cache.add(_batch(0, 1), {"y": np.zeros(1)})  # nothing more once overflowed
    assert cache.held_batches == 0 and budget.used == 0
    cache.values(_batch(0, 4))
    assert recompute.made == 2 and cache.recomputed == 2
    other = ReferenceCache(["y"], budget)
    other.add(_batch(0, 5), {"y": np.zeros(5)})
    assert other.held_batches == 1 and budget.used == 40


# ---------------------------------------------------------------- cumulative_in: its document and its deadline


def test_partial_configurations_choose_their_edges(zoo) -> None:
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    qg = QdqGraph(pair.quantized, pair.fp32, "net")
    weights = frozenset(e for e, k in qg.kinds.items() if k == "weight")
    assert weights and weights != qg.all_edges
    assert PartialConfig("all").edges(qg) == qg.all_edges
    assert PartialConfig("w", kind="weight").edges(qg) == weights
    assert PartialConfig("a", kind="activation").edges(qg) == qg.all_edges - weights
    conv1 = qg.node("conv1")
    assert PartialConfig("q", quantize=("conv1",)).edges(qg) == conv1.edges("node")
    assert PartialConfig("q", quantize=("conv1",), kind="weight").edges(qg) == conv1.edges("node") & weights
    assert PartialConfig("x", exclude=("conv1",), kind="weight").edges(qg) == weights - conv1.edges("node")


def test_cumulative_in_writes_what_it_measured(zoo) -> None:
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    configs = [PartialConfig("q", quantize=("conv1", "gemm"), kind="weight"), PartialConfig("x", exclude=("conv3",))]
    with open_session(pair, zoo["data"], "mse,cosine") as session:
        result = cumulative_in(session, configs, average_mode=True)
        plain = cumulative_in(session, configs)
    assert (result.fp32_model, result.quantized_model, result.data, result.records) == (
        "net.onnx",
        "net.qdq_u8.onnx",
        "data.h5",
        12,
    )
    assert result.metric == "mse" and result.formula == get_metric("mse").formula and result.higher_is_better is False
    assert result.average_mode is True and plain.average_mode is False
    qg = QdqGraph(pair.quantized, pair.fp32, "net")
    assert result.nodes == [n.name for n in qg.nodes]
    ops = {n.name: n.op_type for n in pair.fp32.graph.node}
    assert result.op_types == [ops[n] for n in result.nodes]
    assert [(c.label, c.quantize, c.exclude, c.kind) for c in result.curves] == [
        ("q", ["conv1", "gemm"], [], "weight"),
        ("x", None, ["conv3"], "node"),
    ]
    for mean, curve in zip(result.curves, plain.curves, strict=True):
        assert mean.values == running_mean(curve.values) and len(curve.values) == len(result.nodes)
    # conv1, the first node, has its weight quantized in the first configuration: its point is off already
    assert plain.curves[0].values[0] > 0.0


class CountedRuns:
    """cumulative's OrtRunner, counting the runs of the float reference and of each configuration."""

    def __init__(self, monkeypatch) -> None:
        from pytest_qaccuracy.analysis import cumulative
        from pytest_qaccuracy.runtime import OrtRunner

        self.runs: list[str] = []
        runs = self.runs

        class Counted(OrtRunner):
            def run(self, batch):
                runs.append(self.label)
                return super().run(batch)

        monkeypatch.setattr(cumulative, "OrtRunner", Counted)


class Ticks:
    """A clock that reads ``times`` one after another (the last one from then on)."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


def test_cumulative_in_checks_the_deadline_before_every_run(zoo, monkeypatch) -> None:
    counted = CountedRuns(monkeypatch)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with open_session(pair, zoo["data"], "cosine") as session:
        with pytest.raises(DeadlineReached):
            cumulative_in(session, DEFAULT_CONFIGS, deadline=Deadline(1.0, 1.0, Ticks(5.0)))
        assert counted.runs == []  # passed before the first batch: no model ran
        with pytest.raises(DeadlineReached):
            cumulative_in(session, DEFAULT_CONFIGS, deadline=Deadline(1.0, 1.0, Ticks(0.0, 0.5, 5.0)))
        # the float reference and the first configuration ran; the second did not start
        assert counted.runs == ["net.qdq_u8.onnx (float)", "net.qdq_u8.onnx [fully quantized]"]
        counted.runs.clear()
        cumulative_in(session, DEFAULT_CONFIGS[1:], deadline=Deadline(1.0, 1.0, Ticks(0.0)))
    labels = ["net.qdq_u8.onnx (float)", "net.qdq_u8.onnx [weights only]", "net.qdq_u8.onnx [activations only]"]
    assert len(counted.runs) % 3 == 0 and counted.runs == labels * (len(counted.runs) // 3)


def test_a_node_without_an_output_pair_is_compared_at_its_own_output(zoo, tmp_path) -> None:
    """The zoo's QDQ model with the pair after the last MatMul removed: MatMul writes ``logits`` in
    float, so its point compares that tensor itself (mse: mean over records of mean((f - q)^2))."""
    model = onnx.load(str(zoo["qdq_u8"]))
    graph = model.graph
    pair_nodes = [n for n in graph.node if n.output[0] in ("logits_QuantizeLinear_Output", "logits")]
    assert [n.op_type for n in pair_nodes] == ["QuantizeLinear", "DequantizeLinear"]
    matmul = next(n for n in graph.node if n.op_type == "MatMul")
    matmul.output[0] = "logits"
    for node in pair_nodes:
        graph.node.remove(node)
    # and a dead end in both models: a Relu of the Gemm's output that nothing reads
    graph.node.append(onnx.helper.make_node("Relu", ["gemm_DequantizeLinear_Output"], ["dead"], name="dead"))
    path = tmp_path / "net.no_output_pair.onnx"
    onnx.save(model, str(path))
    fp32 = onnx.load(str(zoo["fp32"]))
    fp32.graph.node.append(onnx.helper.make_node("Relu", ["gemm"], ["dead"], name="dead"))
    fp32_path = tmp_path / "net.dead.onnx"
    onnx.save(fp32, str(fp32_path))
    pair = ModelPair(fp32_path, path)
    with open_session(pair, zoo["data"], "mse") as session:
        result = cumulative_in(session, DEFAULT_CONFIGS[:1])
    assert result.nodes[-2:] == ["matmul", "dead"]
    f, q = _logits(zoo["fp32"]).astype(np.float64), _logits(path).astype(np.float64)
    expected = float(np.mean(np.mean((f - q) ** 2, axis=1)))
    assert result.curves[0].values[-2] == pytest.approx(expected, rel=1e-5)
    # the dead end, run by onnxruntime with its output exposed in each model
    dead = []
    for each in (fp32, model):
        each.graph.output.append(onnx.helper.make_tensor_value_info("dead", onnx.TensorProto.FLOAT, None))
        session = ort.InferenceSession(each.SerializeToString(), providers=["CPUExecutionProvider"])
        dead.append(session.run(["dead"], {"x": _records()})[0].astype(np.float64))
    expected = float(np.mean(np.mean((dead[0] - dead[1]) ** 2, axis=1)))
    assert result.curves[0].values[-1] == pytest.approx(expected, rel=1e-5)


class Recorder:
    """A progress line that records what the analysis shows: the task's label and total, each advance."""

    def __init__(self) -> None:
        self.shown: list[tuple] = []

    def start(self, label: str, total: int) -> None:
        self.shown.append(("start", label, total))

    def advance(self, records: int) -> None:
        self.shown.append(("advance", records))

    def finish(self) -> None:
        self.shown.append(("finish",))

    def close(self) -> None:
        self.shown.append(("close",))


def test_cumulative_in_shows_its_progress_in_records(zoo) -> None:
    line = Recorder()
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with open_session(pair, zoo["data"], "mse", RuntimeOptions(batch_size=5)) as session, reporting(line):
        cumulative_in(session, DEFAULT_CONFIGS[:1])
    assert line.shown == [
        ("start", "cumulative", 12),
        ("advance", 5),
        ("advance", 5),
        ("advance", 2),
        ("finish",),
        ("close",),
    ]


def test_defaults_keep_at_most_ten_nodes_in_float() -> None:
    nodes = [f"n{i}" for i in range(12)]
    results = [{"y": {"cosine": 0.5, "mse": 1.0}}] * 13
    sweep = sweep_in(FakeSession(nodes, results), FakeRanking(nodes))
    assert len(sweep.steps) == 11 and sweep.steps[-1].excluded == nodes[:10]
    three = _sweep(
        target=Target("cosine", 0.9),
        steps=[SweepStep(0, [], {"cosine": 0.5}), SweepStep(1, ["a"], {"cosine": 0.75}), SweepStep(2, ["a", "b"], {})],
    )
    # the best is the last step's value (here undefined), not the middle one's
    assert three.nodes_to_exclude() == "no exclusion list up to 2 node(s) meets cosine >= 0.9 (best: None)"


class MeasuredSteps:
    """task_sweep's measure_outputs, recorded: each call returns the next hand-written task value."""

    def __init__(self, monkeypatch, values: list[tuple[float | None, float | None]]) -> None:
        self.values, self.calls = values, []
        monkeypatch.setattr(task_sweep_module, "measure_outputs", self)

    def __call__(self, pair, sample, **kwargs):
        self.calls.append((pair, len(sample), kwargs))
        fp32, quantized = self.values[len(self.calls) - 1]
        value = SimpleNamespace(
            quantized=quantized, drop=None if fp32 is None or quantized is None else fp32 - quantized
        )
        return SimpleNamespace(task={"f1": value})


def test_task_sweep_hands_its_choices_to_each_measurement(zoo, damaged, monkeypatch) -> None:
    pair = ModelPair(zoo["fp32"], damaged)
    order = _order(pair)
    assert len(order) == 11
    steps = MeasuredSteps(monkeypatch, [(1.0, 0.25)] * 12)
    options = RuntimeOptions(batch_size=3)
    sweep = task_sweep(pair, zoo["data"], F1_SPEC, "min:f1", 0.5, order, targets=list(range(12)), options=options)
    assert len(sweep.steps) == 11 and sweep.suggestion is None  # at most ten nodes in float by default
    first_pair, records, kwargs = steps.calls[0]
    assert first_pair.fp32 is pair.fp32 and records == 12
    assert kwargs == {"options": options, "tasks": [F1_SPEC], "targets": list(range(12))}
    steps.calls.clear()
    task_sweep(pair, zoo["data"], F1_SPEC, "min:f1", 0.5, order, targets=list(range(12)), records=4, max_excluded=0)
    assert [(records, kwargs["targets"]) for _, records, kwargs in steps.calls] == [(4, [0, 1, 2, 3])]


def test_task_sweep_names_an_unknown_node_with_the_model(zoo, damaged) -> None:
    pair = ModelPair(zoo["fp32"], damaged)
    with pytest.raises(ModelError) as err:
        task_sweep(pair, zoo["data"], F1_SPEC, "min:f1", 2.0, ["nope"], max_excluded=1)
    assert str(err.value).startswith("net.damaged.onnx: no quantized node 'nope'; quantized nodes: conv1, ")
