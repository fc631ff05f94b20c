"""A pair's failed checks as the recipe checks the pytest analysis aims at (issue 31 items 1, 2, 6):
every kind of outcome the plugin's checks produce, mapped or skipped with a reason; the checks' own
semantics (one output or view, strict bounds) in ``judge`` and in the Evaluator, against numpy."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pytest_qaccuracy.analysis.checks import compared, evaluate, on_target, unmeasured
from pytest_qaccuracy.analysis.outputs import OutputStats
from pytest_qaccuracy.analysis.recipe.aims import KIND_AIMS, NOT_AIMED, aim, recipe_checks
from pytest_qaccuracy.analysis.recipe.checks import Check, parse_check
from pytest_qaccuracy.analysis.recipe.measure import Evaluator, judge
from pytest_qaccuracy.analysis.recipe.search import RecipeResult, Step
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.analysis.results import ComparisonResult, OutputResult
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.outcomes import KINDS, Outcome
from pytest_qaccuracy.report.recipe_tables import steps_table, verdict_lines
from pytest_qaccuracy.runtime import RuntimeOptions
from pytest_qaccuracy.tolerances import Tolerance

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
QDQ = SUITE / "models" / "digits_cnn.qdq.onnx"
TEST = SUITE / "data" / "digits_test.npz"


def _tolerance(
    check: str,
    metric: str,
    op: str,
    threshold: float,
    value: float | None,
    output: str = "logits",
    k: int | None = None,
):
    outcome = compared(
        "tolerance", check, "output", f"output '{output}'", metric, op, threshold, value, f"marker {check}="
    )
    return replace(outcome, output=output, k=k)


def test_every_outcome_kind_has_an_aim_or_a_reason() -> None:
    assert set(KIND_AIMS) == set(KINDS)
    assert set(NOT_AIMED) == {"drift", "saturation", "gate", "error"}


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        # named output tolerances: the same metric and direction, on every output
        (_tolerance("min_cosine", "cosine", ">=", 0.99, 0.9), Check("cosine", 0.99, True)),
        (_tolerance("min_sqnr", "sqnr", ">=", 20.0, 3.0), Check("sqnr", 20.0, True)),
        (_tolerance("max_lsb", "lsb", "<=", 4.0, 9.0), Check("lsb", 4.0, False)),
        # top-k: agreement, and the drop at k = 1 and at the topk rank
        (
            _tolerance("min_top1_agreement", "top-1 agreement", ">=", 0.9, 0.5, k=1),
            Check("min_top1_agreement", 0.9, True, "topk", 0.01, 1),
        ),
        (
            _tolerance("max_top1_drop", "top-5 accuracy drop", "<=", 0.01, 0.2, k=5),
            Check("max_top5_drop", 0.01, False, "topk", 0.01, 5),
        ),
        # output rules: any registered metric, either direction, strict operators kept
        (
            compared("rule", "* mse<1e-4", "output", "output 'logits'", "mse", "<", 1e-4, 0.1, "ini"),
            Check("mse", 1e-4, False, strict=True),
        ),
        (
            compared("rule", "* max_abs<=0.5", "output", "output 'logits'", "max_abs", "<=", 0.5, 2.0, "ini"),
            Check("max_abs", 0.5, False),
        ),
        (
            compared("rule", "* cosine>0.999", "output", "output 'logits'", "cosine", ">", 0.999, 0.99, "ini"),
            Check("cosine", 0.999, True, strict=True),
        ),
        # a task bound: the plugin's own syntax, read by the recipe's parser
        (
            compared("task", "max_drop:cer", "task", "task 'cer'", "cer drop", "<=", 0.005, 0.02, "marker"),
            parse_check("max_drop:cer<=0.005"),
        ),
        (
            compared("task", "min:exact_match", "task", "task 'exact_match'", "exact_match", ">=", 0.9, 0.5, "ini"),
            Check("min:exact_match", 0.9, True, "task", 0.01),
        ),
    ],
)
def test_a_failed_check_maps_to_the_check_that_measures_it(outcome: Outcome, expected: Check) -> None:
    assert not outcome.passed
    assert aim(outcome) == expected
    # the same check failed on a deployment target only: the same recipe check (measured on every target)
    (deployed,) = on_target([outcome], "onnxruntime-vnni")
    assert deployed.deployment == "onnxruntime-vnni" and aim(deployed) == expected


def test_rtol_atol_is_the_allclose_check_with_both_numbers() -> None:
    outcome = replace(
        _tolerance("rtol", "relative", "<=", 0.0, 0.25), params={"rtol": 0.1, "atol": 2.0}, source="marker"
    )
    assert not outcome.passed
    found = aim(outcome)
    assert found == Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.1, atol=2.0)
    assert str(found) == "allclose <= 0 (rtol=0.1, atol=2)"
    # rtol alone: atol 0, as the plugin's check counts it
    alone = Outcome.from_dict({**outcome.to_dict(), "params": {"rtol": 0.1}})
    assert aim(alone) == Check("allclose", 0.0, False, "allclose", 1.0, rtol=0.1, atol=0.0)


def test_a_views_own_check_holds_on_that_view_only() -> None:
    views = {"head": "logits[:, 0:5]"}
    rule = compared("rule", "mse<4", "output", "output 'head'", "mse", "<", 4.0, 90.0, "slice 'head' rules")
    view_rule = replace(rule, output="head")
    assert aim(view_rule, views) == Check("mse", 4.0, False, strict=True, output="head", view="logits[:, 0:5]")
    assert str(aim(view_rule, views)) == "mse < 4 on 'head'"
    # the pair's tolerance failing on a real output holds on every output
    assert aim(_tolerance("min_sqnr", "sqnr", ">=", 20.0, 3.0), views).output is None


@pytest.mark.parametrize(
    ("outcome", "why"),
    [
        (
            compared("rule", "*::conv* sqnr>=20", "layer", "layer 'conv1'", "sqnr", ">=", 20.0, 3.0, "ini"),
            "the search measures outputs, not layers",
        ),
        (
            compared("tolerance", "min_channel_steps", "output", "output 'logits'", "channel steps", ">=", 2, 1, "m"),
            "the search does not measure channel steps",
        ),
        (
            compared("gate", "max_backend_steps", "model", "tensor 'a'", "steps vs onnxruntime", "<=", 1, 3, "m"),
            NOT_AIMED["gate"],
        ),
        (
            compared("saturation", "max_saturated", "model", "avx2 pair sums", "saturated", "<=", 0.0, 0.1, "m"),
            NOT_AIMED["saturation"],
        ),
        (
            compared("drift", "baseline", "output", "output 'logits'", "cosine", ">=", 0.99, 0.9, "m"),
            NOT_AIMED["drift"],
        ),
        (unmeasured("error", "check", "model", "pair", "error", "m", "boom"), "it measured nothing"),
        (
            unmeasured("tolerance", "min_top1_agreement", "output", "outputs", "top-1", "m", "no class scores"),
            "it measured nothing",
        ),
        (
            _tolerance("max_top1_drop", "top-1 accuracy drop", "<=", 0.01, None, k=1),
            "it measured nothing (the data has no labels)",
        ),
        (
            compared("rule", "* clipped2<=0", "output", "output 'logits'", "clipped2", "<=", 0.0, 0.1, "ini"),
            "the search does not measure 'clipped2'",
        ),
    ],
)
def test_a_check_no_recipe_check_measures_is_skipped_with_its_reason(outcome: Outcome, why: str) -> None:
    assert aim(outcome) == why
    checks, skipped = recipe_checks([outcome])
    assert checks == [] and skipped == [f"{outcome.check}: {why}"]


def test_a_top_k_drop_aims_at_the_k_it_was_checked_at_not_at_its_text() -> None:
    """The rank rides from the check that counted it (``Outcome.k``); the metric's text is for people."""
    result = ComparisonResult("f.onnx", "q.onnx", "d.npz", 8, {}, [OutputResult("y", {})], [])
    per_k = {"agreement": 1.0, "fp32_accuracy": 0.75, "quantized_accuracy": 0.5, "accuracy_drop": 0.25}
    stats = OutputStats(topk={"y": {"counted": "per record", "k": {"1": per_k, "3": per_k}}}, relative={})
    tolerances = {"max_top1_drop": Tolerance("max_top1_drop", 0.125, "ini"), "topk": Tolerance("topk", 3, "ini")}
    top1, top3 = evaluate(result, stats, tolerances, [], "net")
    assert aim(top3) == Check("max_top3_drop", 0.125, False, "topk", 0.01, 3)
    assert aim(replace(top3, metric="accuracy drop at the third rank")) == aim(top3)
    assert aim(replace(top1, metric="top-3 accuracy drop")) == Check("max_top1_drop", 0.125, False, "topk", 0.01, 1)


def test_recipe_checks_keeps_every_aimed_one_once_in_order() -> None:
    """The failed checks, and the passing ones a recipe must not break; skip lines for failed ones only."""
    cosine_a = _tolerance("min_cosine", "cosine", ">=", 0.99, 0.9, "a")
    cosine_b = _tolerance("min_cosine", "cosine", ">=", 0.99, 0.8, "b")
    passed = _tolerance("min_sqnr", "sqnr", ">=", 20.0, 30.0)
    drop = _tolerance("max_top1_drop", "top-1 accuracy drop", "<=", 0.01, 0.2, k=1)
    gate = compared("gate", "max_backend_steps", "model", "tensor 'a'", "steps vs onnxruntime", "<=", 1, 3, "m")
    checks, skipped = recipe_checks([cosine_a, passed, drop, *on_target([cosine_b], "power2"), gate, gate])
    assert [str(c) for c in checks] == ["cosine >= 0.99", "sqnr >= 20", "max_top1_drop <= 0.01"]
    assert skipped == [f"max_backend_steps: {NOT_AIMED['gate']}"]


def test_passing_checks_alone_ask_for_no_recipe() -> None:
    passed = _tolerance("min_sqnr", "sqnr", ">=", 20.0, 30.0)
    gate = compared("gate", "max_backend_steps", "model", "tensor 'a'", "steps vs onnxruntime", "<=", 1, 3, "m")
    assert recipe_checks([passed]) == ([], [])
    assert recipe_checks([passed, gate]) == ([], [f"max_backend_steps: {NOT_AIMED['gate']}"])


def test_judge_reads_one_output_and_keeps_strict_bounds() -> None:
    measured = {"onnxruntime": {"a": {"mse": 4.0}, "b": {"mse": 1.0}}}
    assert not judge(measured, [Check("mse", 2.0, False)]).passed  # every output: 'a' fails
    assert judge(measured, [Check("mse", 2.0, False, output="b")]).passed  # 'b' only
    assert not judge(measured, [Check("mse", 2.0, False, output="c")]).passed  # no such output: unmet
    assert judge(measured, [Check("mse", 1.0, False, output="b")]).passed
    at_bound = judge(measured, [Check("mse", 1.0, False, strict=True, output="b")])
    assert not at_bound.passed and at_bound.margin < 0  # '<' excludes the bound, as the plugin's rule
    assert Check("cosine", 0.9, True, strict=True).met(0.9000001) and not Check("cosine", 0.9, True, strict=True).met(
        0.9
    )


def test_strict_targets_parse() -> None:
    check = parse_check("cosine>0.99")
    assert check.strict and str(check) == "cosine > 0.99"
    assert parse_check("mse<1e-4") == Check("mse", 1e-4, False, strict=True)


def test_the_recipe_tables_read_each_checks_fields_carried_through_the_json() -> None:
    """A result keeps its checks (``check_fields`` beside their text, as it crosses from an xdist
    worker): the tables take the metric, direction and one output from them, not from the text."""
    head = Check("mse", 4.0, False, strict=True, output="head", view="logits[:, 0:5]")
    checks = [head, Check("cosine", 0.99, True), parse_check("max_drop:cer<=0.005")]
    measured = {"onnxruntime": {"logits": {"mse": 9.0, "cosine": 0.5}, "head": {"mse": 3.0, "cosine": 0.9}}}
    measured["onnxruntime"]["(task)"] = {"max_drop:cer": 0.25}
    step = Step(0, "start", "starting recipe", Recipe(), 0.0, measured, False, -0.5, 1.0)
    result = RecipeResult("f.onnx", "c.npz", "e.npz", 8, checks, ["onnxruntime"], {}, [step], 0, "done", 1.0)
    document = json.loads(json.dumps(result.to_dict()))
    assert document["checks"] == ["mse < 4 on 'head'", "cosine >= 0.99", "max_drop:cer <= 0.005"]
    assert RecipeResult.from_dict(document) == result and RecipeResult.from_dict(document).checks == checks
    # the head's own mse (not the worst output's 9), the worst cosine (the lower), the task value
    assert verdict_lines(result)[0].endswith(
        "mse 'head' 3 on onnxruntime; cosine 0.5000 on onnxruntime; max_drop:cer 0.25 on onnxruntime; "
        "margin -0.5; cost 0"
    )
    assert steps_table(result).splitlines()[0].split()[4:] == [
        "mse", "'head'", "onnxruntime", "cosine", "onnxruntime", "max_drop:cer", "onnxruntime", "verdict"
    ]  # fmt: skip


def test_the_evaluator_measures_a_view_and_the_outputs_step_as_numpy_does() -> None:
    """A view's mse and the output's lsb (its error in the quantized output's steps), measured by the
    Evaluator on the qdq model, against numpy on onnxruntime's outputs."""
    x = np.load(TEST)["x"]
    f = _run(FP32, x)
    q = _run(QDQ, x)
    view = Check("mse", 4.0, False, strict=True, output="head", view="logits[:, 0:5]")
    lsb = Check("lsb", 100.0, False)
    verdict = Evaluator(FP32, TEST, [view, lsb], ["onnxruntime"], RuntimeOptions()).measure(QDQ)
    per = verdict.measured["onnxruntime"]
    head = ((f[:, 0:5] - q[:, 0:5]) ** 2).mean(axis=1).mean()
    assert per["head"]["mse"] == pytest.approx(head, rel=1e-6)  # float32 sums
    assert "lsb" not in per["head"]  # the view measures its own checks' metrics only
    scale = _output_scale(QDQ, "logits")
    assert per["logits"]["lsb"] == pytest.approx(np.abs(f - q).max() / scale, rel=1e-6)
    assert verdict.passed


def _run(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0].astype(np.float64)


def _output_scale(model: Path, output: str) -> float:
    proto = onnx.load(str(model))
    node = next(n for n in proto.graph.node if output in n.output)
    assert node.op_type == "DequantizeLinear"
    init = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    return float(init[node.input[1]])


def test_a_top_k_drop_read_back_without_its_rank_is_not_aimed_at() -> None:
    """An outcome written without ``k`` (a results file from before the rank rode along) reads back
    with k None: the search cannot tell which rank to measure, so it says so and aims elsewhere."""
    written = _tolerance("max_top1_drop", "top-3 accuracy drop", "<=", 0.01, 0.2, k=3).to_dict()
    written.pop("k", None)
    outcome = Outcome.from_dict(written)
    assert outcome.k is None
    assert aim(outcome) == "the search does not measure 'top-3 accuracy drop'"
    assert recipe_checks([outcome]) == ([], ["max_top1_drop: the search does not measure 'top-3 accuracy drop'"])


def test_the_evaluator_refuses_a_view_of_an_output_the_model_lacks() -> None:
    check = Check("mse", 4.0, False, strict=True, output="head", view="scores[:, 0:5]")
    with pytest.raises(InputError) as info:
        Evaluator(FP32, TEST, [check], ["onnxruntime"], RuntimeOptions())
    assert str(info.value) == f"{FP32}: slice 'head': no output 'scores' (outputs: logits)"


def test_the_evaluator_refuses_a_bad_view_before_reading_the_data(tmp_path) -> None:
    """The view is checked against the model's outputs first: with data that cannot even be found the
    error is still the view's (it read every record before it checked the views)."""
    check = Check("mse", 4.0, False, strict=True, output="head", view="scores[:, 0:5]")
    with pytest.raises(InputError) as info:
        Evaluator(FP32, str(tmp_path / "missing.npz"), [check], ["onnxruntime"], RuntimeOptions())
    assert str(info.value) == f"{FP32}: slice 'head': no output 'scores' (outputs: logits)"
