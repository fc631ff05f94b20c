"""Pair checks (``analysis/checks.py``) and their failure messages (``plugin/checks.py``), without a session.

The expected outcomes and message lines are written from the layout in docs/pytest.md ("A failure
reads: ...") with the numbers worked out by hand; the inputs are dyadic fractions, so every figure
prints exactly.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pytest_qaccuracy.analysis.checks import evaluate, gate_outcome, saturation_outcome
from pytest_qaccuracy.analysis.outputs import OutputStats, RelativeStats, TaskValue
from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.analysis.saturation import LayerSaturation, SaturationReport
from pytest_qaccuracy.backend.agreement import AgreementResult, TensorAgreement
from pytest_qaccuracy.outcomes import Outcome
from pytest_qaccuracy.plugin.checks import failure_message, gate_notes, saturation_notes
from pytest_qaccuracy.tolerances import Tolerance, parse_rule, parse_rules

INI = "ini file pytest.ini"


def _result(outputs: list[OutputResult], layers: list[LayerResult] = ()) -> ComparisonResult:
    return ComparisonResult(
        fp32_model="net.onnx",
        quantized_model="net.int8.onnx",
        data="data.npz",
        records=8,
        metric_definitions={"sqnr": "signal to noise", "cosine": "cosine similarity", "lsb": "steps"},
        outputs=list(outputs),
        layers=list(layers),
        higher_is_better={"sqnr": True, "cosine": True, "lsb": False},
    )


def _layer(tensor: str, order: int, op_type: str | None = "Conv", node: str | None = None, **metrics) -> LayerResult:
    return LayerResult(tensor, tensor, node, op_type, order, metrics)


def _fail(detail: str) -> Outcome:
    return Outcome(
        check="min_cosine",
        kind="tolerance",
        scope="output",
        subject="output 'y'",
        output="y",
        metric="cosine",
        op=">=",
        threshold=0.99,
        value=0.5,
        passed=False,
        source="marker",
        detail=detail,
    )


def test_named_tolerances_on_each_output_with_their_boundaries() -> None:
    y = OutputResult("y", {"cosine": 0.875, "sqnr": 20.0, "lsb": 2.5})
    z = OutputResult("z", {"cosine": None, "lsb": 2.0}, undefined={"cosine": "all-zero reference"})
    tolerances = {
        "min_cosine": Tolerance("min_cosine", 0.875, "marker"),
        "min_sqnr": Tolerance("min_sqnr", 20.5, INI),
        "max_lsb": Tolerance("max_lsb", 2.0, "--qaccuracy-max-lsb"),
    }
    assert evaluate(_result([y, z]), None, tolerances, [], "net") == [
        Outcome(
            check="min_cosine",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            metric="cosine",
            op=">=",
            threshold=0.875,
            value=0.875,
            passed=True,
            source="marker",
            detail="cosine 0.875 >= 0.875 for output 'y'",
        ),
        Outcome(
            check="min_sqnr",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            metric="sqnr",
            op=">=",
            threshold=20.5,
            value=20.0,
            passed=False,
            source=INI,
            detail="sqnr 20 dB < 20.5 dB for output 'y'",
        ),
        Outcome(
            check="max_lsb",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            metric="lsb",
            op="<=",
            threshold=2.0,
            value=2.5,
            passed=False,
            source="--qaccuracy-max-lsb",
            detail="lsb 2.5 > 2 for output 'y'",
        ),
        Outcome(
            check="min_cosine",
            kind="tolerance",
            scope="output",
            subject="output 'z'",
            output="z",
            metric="cosine",
            op=">=",
            threshold=0.875,
            value=None,
            passed=False,
            source="marker",
            detail="cosine undefined for output 'z' (all-zero reference)",
        ),
        Outcome(
            check="min_sqnr",
            kind="tolerance",
            scope="output",
            subject="output 'z'",
            output="z",
            metric="sqnr",
            op=">=",
            threshold=20.5,
            value=None,
            passed=False,
            source=INI,
            detail="sqnr undefined for output 'z' (metric not computed)",
        ),
        Outcome(
            check="max_lsb",
            kind="tolerance",
            scope="output",
            subject="output 'z'",
            output="z",
            metric="lsb",
            op="<=",
            threshold=2.0,
            value=2.0,
            passed=True,
            source="--qaccuracy-max-lsb",
            detail="lsb 2 <= 2 for output 'z'",
        ),
    ]


def test_values_become_plain_floats() -> None:
    """execnet cannot carry numpy scalars to the xdist controller."""
    y = OutputResult("y", {"cosine": np.float32(0.5)})
    (outcome,) = evaluate(_result([y]), None, {"min_cosine": Tolerance("min_cosine", 0.25, "marker")}, [], "net")
    assert type(outcome.value) is float and outcome.value == 0.5 and outcome.passed


def test_relative_tolerance_counts_the_share_of_elements_outside() -> None:
    result = _result([OutputResult("y", {}), OutputResult("z", {})])
    rel = RelativeStats(rtol=0.01, atol=0.001, violations=3, elements=12, max_abs=0.5, max_rel=0.25)
    clean = RelativeStats(rtol=0.01, atol=0.001, violations=0, elements=0, max_abs=0.0, max_rel=0.0)
    stats = OutputStats(topk={}, relative={"y": rel, "z": clean})
    bounds = "outside atol + rtol*|fp32| (rtol=0.01, atol=0.001)"
    assert evaluate(
        result, stats, {"rtol": Tolerance("rtol", 0.01, "marker"), "atol": Tolerance("atol", 0.001, INI)}, [], "net"
    ) == [
        Outcome(
            check="rtol",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            metric="relative",
            op="<=",
            threshold=0.0,
            value=0.25,
            passed=False,
            source="marker",
            detail=f"3 / 12 elements (25%) {bounds} for output 'y'",
            params={"rtol": 0.01, "atol": 0.001},
        ),
        Outcome(
            check="rtol",
            kind="tolerance",
            scope="output",
            subject="output 'z'",
            output="z",
            metric="relative",
            op="<=",
            threshold=0.0,
            value=0.0,
            passed=True,
            source="marker",
            detail=f"0 / 0 elements (0%) {bounds} for output 'z'",
            params={"rtol": 0.01, "atol": 0.001},
        ),
    ]
    (atol_only, _) = evaluate(result, stats, {"atol": Tolerance("atol", 0.001, INI)}, [], "net")
    assert (atol_only.check, atol_only.source, atol_only.value) == ("atol", INI, 0.25)
    missing = OutputStats(topk={}, relative={})
    assert evaluate(
        _result([OutputResult("y", {})]), missing, {"rtol": Tolerance("rtol", 0.01, "marker")}, [], "net"
    ) == [
        Outcome(
            check="rtol",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            metric="relative",
            op="<=",
            threshold=0.0,
            value=None,
            passed=False,
            source="marker",
            detail="no element stats for output 'y'",
            params={"rtol": 0.01},
        )
    ]
    assert (
        evaluate(result, None, {"rtol": Tolerance("rtol", 0.01, "marker")}, [], "net") == []
    )  # no stats measured: no row


def _counts(drop1: float | None, k3: bool) -> dict:
    per_k = {"1": {"agreement": 0.75, "fp32_accuracy": 0.5, "quantized_accuracy": 0.25, "accuracy_drop": drop1}}
    if k3:
        per_k["3"] = {"agreement": 1.0, "fp32_accuracy": 0.75, "quantized_accuracy": 0.75, "accuracy_drop": 0.0}
    return {"records": 8, "counted": "per record", "k": per_k}


def test_topk_agreement_and_accuracy_drop_per_k() -> None:
    result = _result([OutputResult("y", {}), OutputResult("boxes", {})])
    stats = OutputStats(topk={"y": _counts(0.25, k3=True)}, relative={})
    tolerances = {
        "min_top1_agreement": Tolerance("min_top1_agreement", 0.75, "marker"),
        "max_top1_drop": Tolerance("max_top1_drop", 0.125, INI),
        "topk": Tolerance("topk", 3, INI),
    }
    assert evaluate(result, stats, tolerances, [], "net") == [
        Outcome(
            check="min_top1_agreement",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            k=1,
            metric="top-1 agreement",
            op=">=",
            threshold=0.75,
            value=0.75,
            passed=True,
            source="marker",
            detail="top-1 agreement 0.75 >= 0.75 for output 'y'",
        ),
        Outcome(
            check="max_top1_drop",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            k=1,
            metric="top-1 accuracy drop",
            op="<=",
            threshold=0.125,
            value=0.25,
            passed=False,
            source=INI,
            detail="top-1 accuracy drop 0.25 > 0.125 for output 'y' (fp32 0.5, quantized 0.25)",
        ),
        Outcome(
            check="max_top1_drop",
            kind="tolerance",
            scope="output",
            subject="output 'y'",
            output="y",
            k=3,
            metric="top-3 accuracy drop",
            op="<=",
            threshold=0.125,
            value=0.0,
            passed=True,
            source=INI,
            detail="top-3 accuracy drop 0 <= 0.125 for output 'y' (fp32 0.75, quantized 0.75)",
        ),
    ]
    # without topk only top-1; the boxes output was not counted and gets no row
    (top1,) = evaluate(result, stats, {"max_top1_drop": Tolerance("max_top1_drop", 0.25, INI)}, [], "net")
    assert (top1.metric, top1.k, top1.passed) == ("top-1 accuracy drop", 1, True)


def test_topk_drop_undefined_without_labels() -> None:
    result = _result([OutputResult("y", {})])
    unlabelled = OutputStats(topk={"y": _counts(None, k3=False)}, relative={})
    assert [
        o.detail
        for o in evaluate(result, unlabelled, {"max_top1_drop": Tolerance("max_top1_drop", 0.125, INI)}, [], "net")
    ] == [
        "top-1 accuracy drop undefined for output 'y' (the dataset has no labels)",
    ]


def test_topk_tolerance_without_any_class_score_output() -> None:
    result = _result([OutputResult("y", {}), OutputResult("boxes", {})])
    needs = Outcome(
        check="max_top1_drop",
        kind="tolerance",
        scope="output",
        subject="outputs",
        metric="top-1",
        op="",
        threshold=None,
        value=None,
        passed=False,
        source=INI,
        detail="max_top1_drop needs class scores (records, classes), but no output is (y, boxes)",
    )
    assert evaluate(result, None, {"max_top1_drop": Tolerance("max_top1_drop", 0.01, INI)}, [], "net") == [needs]
    assert evaluate(
        result, OutputStats({}, {}), {"max_top1_drop": Tolerance("max_top1_drop", 0.01, INI)}, [], "net"
    ) == [needs]
    both = {
        "max_top1_drop": Tolerance("max_top1_drop", 0.01, INI),
        "min_top1_agreement": Tolerance("min_top1_agreement", 0.9, "marker"),
    }
    assert [(o.check, o.source) for o in evaluate(result, None, both, [], "net")] == [("min_top1_agreement", "marker")]
    counted = OutputStats(topk={"y": _counts(0.0, k3=False)}, relative={})
    assert [
        o.target for o in evaluate(result, counted, {"max_top1_drop": Tolerance("max_top1_drop", 0.01, INI)}, [], "net")
    ] == ["output 'y'"]


def test_rules_on_outputs_then_layers_in_graph_order() -> None:
    y = OutputResult("y", {"cosine": 0.5, "sqnr": 10.0})
    layers = [
        _layer("relu1", 1, "Relu", node="relu1_node", sqnr=25.0),
        _layer("conv1", 0, "Conv", node="conv1_node", sqnr=30.0),
        LayerResult("t", "t_q", None, None, 2, {"sqnr": None}, undefined={"sqnr": "constant reference"}),
    ]
    lines = ["* cosine>=0.75", "*::* sqnr>=26", "*::conv* sqnr>=30", "*::relu1_node cosine>=0.9", "other::* lsb<=0"]
    rules = parse_rules(lines, INI)
    src = {text: f"{INI}, rule '{text}'" for text in lines}
    assert evaluate(_result([y], layers), None, {}, rules, "net") == [
        Outcome(
            check="* cosine>=0.75",
            kind="rule",
            scope="output",
            subject="output 'y'",
            output="y",
            metric="cosine",
            op=">=",
            threshold=0.75,
            value=0.5,
            passed=False,
            source=src["* cosine>=0.75"],
            detail="cosine 0.5 < 0.75 for output 'y'",
        ),
        Outcome(
            check="*::conv* sqnr>=30",
            kind="rule",
            scope="layer",
            subject="layer 'conv1' (Conv)",
            metric="sqnr",
            op=">=",
            threshold=30.0,
            value=30.0,
            passed=True,
            source=src["*::conv* sqnr>=30"],
            detail="sqnr 30 dB >= 30 dB for layer 'conv1' (Conv)",
        ),
        Outcome(
            check="*::* sqnr>=26",
            kind="rule",
            scope="layer",
            subject="layer 'relu1' (Relu)",
            metric="sqnr",
            op=">=",
            threshold=26.0,
            value=25.0,
            passed=False,
            source=src["*::* sqnr>=26"],
            detail="sqnr 25 dB < 26 dB for layer 'relu1' (Relu)",
        ),
        Outcome(
            check="*::relu1_node cosine>=0.9",
            kind="rule",
            scope="layer",
            subject="layer 'relu1' (Relu)",
            metric="cosine",
            op=">=",
            threshold=0.9,
            value=None,
            passed=False,
            source=src["*::relu1_node cosine>=0.9"],
            detail="cosine undefined for layer 'relu1' (Relu) (metric not computed)",
        ),
        Outcome(
            check="*::* sqnr>=26",
            kind="rule",
            scope="layer",
            subject="layer 't'",
            metric="sqnr",
            op=">=",
            threshold=26.0,
            value=None,
            passed=False,
            source=src["*::* sqnr>=26"],
            detail="sqnr undefined for layer 't' (constant reference)",
        ),
    ]


def test_a_pairs_own_layer_rule_that_matches_no_layer_fails() -> None:
    layers = [_layer("relu1", 1, sqnr=25.0), _layer("conv1", 0, node="conv1_node", sqnr=30.0)]
    typo = replace(parse_rule("net::head* sqnr>=8", "marker"), required=True)
    assert evaluate(_result([], layers), None, {}, [typo], "net") == [
        Outcome(
            check="net::head* sqnr>=8",
            kind="rule",
            scope="layer",
            subject="layers",
            metric="sqnr",
            op=">=",
            threshold=8.0,
            value=None,
            passed=False,
            source="marker",
            detail="layer rule 'net::head* sqnr>=8' matches no compared layer (layers: relu1, conv1)",
        )
    ]
    assert evaluate(_result([]), None, {}, [typo], "net")[0].detail.endswith("(layers: none)")
    many = [_layer(f"l{i}", i, sqnr=1.0) for i in range(12)]
    listed = ", ".join(f"l{i}" for i in range(10))
    assert evaluate(_result([], many), None, {}, [typo], "net")[0].detail.endswith(f"(layers: {listed})")
    # the same rule without required, or a required output rule: no such row
    assert evaluate(_result([], layers), None, {}, [replace(typo, required=False)], "net") == []
    output_rule = replace(parse_rule("net cosine>=0.9", "marker"), required=True)
    assert evaluate(_result([], layers), None, {}, [output_rule], "net") == []


def test_a_required_rule_that_matches_but_never_wins_is_not_a_typo() -> None:
    layers = [_layer("conv1", 0, node="conv1_node", sqnr=30.0)]
    by_tensor = replace(parse_rule("*::conv* sqnr>=1", "marker", 0), required=True)
    by_node = replace(parse_rule("*::*_node sqnr>=1", "marker", 0), required=True)
    winner = parse_rule("*::conv1 sqnr>=2", INI, 1)  # more specific than both, and later
    for required in (by_tensor, by_node):
        outcomes = evaluate(_result([], layers), None, {}, [required, winner], "net")
        assert [o.check for o in outcomes] == ["*::conv1 sqnr>=2"]


def _message_result() -> ComparisonResult:
    y = OutputResult("y", {"sqnr": 12.0}, worst_records={"sqnr": [(4, 3.5), (0, 9.0)]})
    layers = [
        _layer("a", 0, "Conv", sqnr=40.0),
        _layer("b", 1, "Relu", sqnr=38.0),
        _layer("c", 2, "Gemm", sqnr=20.0),
        _layer("d", 3, "Softmax", sqnr=19.0),
    ]
    return _result([y], layers)


def test_failure_message_layout() -> None:
    first = Outcome(
        check="* sqnr>=20",
        kind="rule",
        scope="output",
        subject="output 'y'",
        output="y",
        metric="sqnr",
        op=">=",
        threshold=20.0,
        value=12.0,
        passed=False,
        source=f"{INI}, rule '* sqnr>=20'",
        detail="sqnr 12 dB < 20 dB for output 'y'",
    )
    others = [_fail(f"failure {i}") for i in range(12)]
    message = failure_message("net", [first, *others], _message_result(), extra=["Artifacts: x.json"])
    assert message.splitlines() == [
        "sqnr 12 dB < 20 dB for output 'y' (pair 'net')",
        f"Tolerance from: {INI}, rule '* sqnr>=20'",
        "",
        "Also failed (12):",
        *(f" failure {i}" for i in range(10)),
        " ... and 2 more",
        "",
        "Worst records (sqnr):",
        " record 4: 3.5",
        " record 0: 9",
        "",
        "Worst layers (sqnr):",
        " d (Softmax): 19 dB",
        " c (Gemm): 20 dB",
        " b (Relu): 38 dB",
        " a (Conv): 40 dB",
        "First jump (sqnr): c (Gemm): 38 dB -> 20 dB",
        "",
        "Artifacts: x.json",
    ]


def test_failure_message_of_a_single_failure_without_results() -> None:
    first = _fail("cosine 0.5 < 0.99 for output 'y'")
    assert (
        failure_message("net", [first], None) == "cosine 0.5 < 0.99 for output 'y' (pair 'net')\nTolerance from: marker"
    )
    ten = [first, *(_fail(f"f{i}") for i in range(10))]
    assert failure_message("net", ten, None).splitlines()[-1] == " f9"  # all ten others shown, no "... more"


def test_failure_message_of_a_relative_check_on_a_deployment_target() -> None:
    rel = RelativeStats(0.01, 0.001, 3, 12, 0.5, 0.25, worst=[(2, "[0, 1]", 1.5, 1.0), (5, "[1, 0]", -0.25, 0.25)])
    stats = OutputStats(topk={}, relative={"y": rel})
    first = Outcome(
        check="rtol",
        kind="tolerance",
        scope="output",
        subject="output 'y'",
        output="y",
        deployment="onnxruntime-avx2",
        metric="relative",
        op="<=",
        threshold=0.0,
        value=0.25,
        passed=False,
        source="marker",
        detail="3 / 12 elements outside",
    )
    result = _result([OutputResult("y", {"sqnr": 12.0}, worst_records={"relative": [(1, 2.0)]})])
    assert failure_message("net", [first], result, stats).splitlines() == [
        "3 / 12 elements outside (pair 'net')",
        "Tolerance from: marker",
        "",
        "Worst records (relative):",
        " record 1: 2",
        "",
        "Max absolute difference among violations: 0.5",
        "Max relative difference among violations: 0.25",
        "Worst elements:",
        " record 2 [0, 1]: 1.5 (ACTUAL), 1 (EXPECTED)",
        " record 5 [1, 0]: -0.25 (ACTUAL), 0.25 (EXPECTED)",
    ]
    # no worst elements: none recorded, no stats, or another check
    quiet = OutputStats(topk={}, relative={"y": replace(rel, worst=[])})
    assert "Worst elements:" not in failure_message("net", [first], result, quiet)
    assert "Worst elements:" not in failure_message("net", [first], result, None)
    assert "Worst elements:" not in failure_message("net", [replace(first, metric="cosine")], result, stats)
    # "on" followed by something that is not a preset is part of the output's name
    odd = OutputResult("y' on nothing", {}, worst_records={"relative": [(0, 1.0)]})
    on_own = replace(first, subject="output 'y' on nothing'", output="y' on nothing", deployment=None)
    message = failure_message("net", [on_own], _result([odd]), stats)
    assert " record 0: 1" in message.splitlines()


def test_failure_message_layers_fall_back_to_sqnr() -> None:
    first = _fail("cosine 0.5 < 0.99 for output 'y'")
    lsb = replace(first, metric="max_steps")  # not a layer metric: the layers are ranked by SQNR
    lines = failure_message("net", [lsb], _message_result()).splitlines()
    assert lines[lines.index("Worst layers (sqnr):") + 1] == " d (Softmax): 19 dB"
    cosine_layers = [_layer("a", 0, cosine=0.75), _layer("b", 1, cosine=0.25)]
    lines = failure_message("net", [first], _result([], cosine_layers)).splitlines()
    # cosine error (distance from 1) goes 0.25 -> 0.75: it more than doubles at b
    assert lines[-4:] == [
        "Worst layers (cosine):",
        " b (Conv): 0.25",
        " a (Conv): 0.75",
        "First jump (cosine): b (Conv): 0.75 -> 0.25",
    ]
    no_sqnr = replace(_result([]), metric_definitions={"cosine": "cosine"}, layers=cosine_layers)
    assert "Worst layers" not in failure_message("net", [lsb], no_sqnr)
    assert "Worst layers" not in failure_message("net", [first], _result([]))


def _saturation(*layers: LayerSaturation) -> SaturationReport:
    return SaturationReport(model="m.onnx", records=4, layers=layers, outputs={"y": 30.0, "z": None})


def _sat(
    node: str, pairs: int, saturated: int, record: int | None = None, tensor: str | None = None
) -> LayerSaturation:
    return LayerSaturation(node, pairs, saturated, record, saturated, tensor, 2, 16, 1)


def test_saturation_outcome_at_and_over_the_threshold() -> None:
    report = _saturation(_sat("conv1", 8, 1, record=3), _sat("conv2", 24, 0))  # 1 / 32 = 3.125 %
    where = "1 / 32 (worst layer 'conv1': 1 / 8, most in record 3)"
    assert saturation_outcome(report, Tolerance("max_saturated", 0.03125, "marker")) == Outcome(
        check="max_saturated",
        kind="saturation",
        scope="model",
        subject="onnxruntime-avx2 pair sums",
        metric="saturated",
        op="<=",
        threshold=0.03125,
        value=0.03125,
        passed=True,
        source="marker",
        detail=f"saturated pair sums 3.125% <= 3.125% on onnxruntime-avx2: {where}",
    )
    over = saturation_outcome(report, Tolerance("max_saturated", 0.03, "marker"))
    assert not over.passed and over.detail == f"saturated pair sums 3.125% > 3% on onnxruntime-avx2: {where}"
    no_record = saturation_outcome(_saturation(_sat("conv1", 8, 1)), Tolerance("max_saturated", 0.5, "marker"))
    assert no_record.detail.endswith("1 / 8 (worst layer 'conv1': 1 / 8)")
    clean = saturation_outcome(_saturation(_sat("conv1", 8, 0)), Tolerance("max_saturated", 0.0, "marker"))
    assert clean.passed and clean.detail == "saturated pair sums 0% <= 0% on onnxruntime-avx2: 0 / 8"


def test_saturation_notes_list_the_worst_layers_first() -> None:
    report = _saturation(
        _sat("conv1", 8, 1, tensor="y1"),
        _sat("conv2", 12, 3),
        _sat("conv3", 8, 0),
        *(_sat(f"extra{i}", 100, 1) for i in range(4)),
    )
    assert saturation_notes(report) == [
        "Layers whose pair sums saturate on onnxruntime-avx2:",
        " conv2: 3 / 12 (25%)",
        " conv1: 1 / 8 (12.5%); output moved in 2 / 16 elements",
        " extra0: 1 / 100 (1%)",
        " extra1: 1 / 100 (1%)",
        " extra2: 1 / 100 (1%)",
        " ... and 1 more",
        "Output 'y': SQNR 30 dB against onnxruntime-vnni",
        "Remedies: 7-bit weights (reduce_range=True), u8 x u8 weights, or the worst layers in float",
    ]
    arm = replace(report, preset="onnxruntime-arm64-neon", exact="onnxruntime-arm64-neon with exact sums")
    notes = saturation_notes(arm)
    assert notes[0] == "Layers whose pair sums wrap on onnxruntime-arm64-neon:"
    assert notes[-2:] == [
        "Output 'y': SQNR 30 dB against onnxruntime-arm64-neon with exact sums",
        "Remedies: symmetric int8 weights (WeightSymmetric), or the worst layers in float",
    ]
    wrapped = saturation_outcome(arm, Tolerance("max_saturated", 0.0, "marker"))
    assert wrapped.subject == "onnxruntime-arm64-neon pair sums"
    assert wrapped.detail.startswith("wrapped pair sums ")
    assert " > 0% on onnxruntime-arm64-neon: 8 / 428 " in wrapped.detail


def test_a_deployment_target_is_a_field_not_text() -> None:
    """The preset a check ran on is a field; ``target`` (the JSON key) is derived from it, never split."""
    outcome = replace(_fail("cosine 0.5 < 0.99"), deployment="onnxruntime-avx2")
    assert (outcome.subject, outcome.deployment) == ("output 'y'", "onnxruntime-avx2")
    assert outcome.target == "output 'y' on onnxruntime-avx2"
    assert Outcome.from_dict(outcome.to_dict()) == outcome


def test_outcome_round_trips_through_a_plain_dict() -> None:
    outcome = _fail("cosine 0.5 < 0.99 for output 'y'")
    data = outcome.to_dict()
    assert data == {
        "kind": "tolerance",
        "check": "min_cosine",
        "scope": "output",
        "subject": "output 'y'",
        "deployment": None,
        "params": {},
        "output": "y",
        "k": None,
        "target": "output 'y'",
        "metric": "cosine",
        "op": ">=",
        "threshold": 0.99,
        "value": 0.5,
        "passed": False,
        "source": "marker",
        "detail": "cosine 0.5 < 0.99 for output 'y'",
    }
    assert Outcome.from_dict(data) == outcome


def test_a_metric_without_value_or_reason_is_just_undefined() -> None:
    y = OutputResult("y", {"cosine": None})
    (outcome,) = evaluate(_result([y]), None, {"min_cosine": Tolerance("min_cosine", 0.5, "marker")}, [], "net")
    assert outcome.detail == "cosine undefined for output 'y'"
    rule = parse_rule("*::* cosine>=0.5", INI)
    (layer,) = evaluate(_result([], [_layer("conv1", 0, cosine=None)]), None, {}, [rule], "net")
    assert layer.detail == "cosine undefined for layer 'conv1' (Conv)"


def test_relative_share_of_a_one_element_output() -> None:
    rel = RelativeStats(rtol=0.0, atol=0.0, violations=1, elements=1, max_abs=1.0, max_rel=1.0)
    stats = OutputStats(topk={}, relative={"y": rel})
    (outcome,) = evaluate(_result([OutputResult("y", {})]), stats, {"atol": Tolerance("atol", 0.0, INI)}, [], "net")
    assert outcome.value == 1.0 and outcome.detail.startswith("1 / 1 elements (100%) outside")


def test_failure_message_short_lists() -> None:
    first, second = replace(_fail("first failure"), metric="sqnr"), _fail("second failure")
    y = OutputResult("y", {"sqnr": 12.0}, worst_records={"sqnr": [(3, 0.5)]})
    many = [_layer(f"l{i}", i, sqnr=40.0 - i) for i in range(7)]
    lines = failure_message("net", [first, second], _result([y], many)).splitlines()
    assert lines[2:5] == ["", "Also failed (1):", " second failure"]
    assert lines[5:8] == ["", "Worst records (sqnr):", " record 3: 0.5"]
    assert lines[lines.index("Worst layers (sqnr):") + 1 :] == [
        " l6 (Conv): 34 dB",
        " l5 (Conv): 35 dB",
        " l4 (Conv): 36 dB",
        " l3 (Conv): 37 dB",
        " l2 (Conv): 38 dB",
        "First jump (sqnr): l1 (Conv): 40 dB -> 39 dB",  # no 6 dB step: the largest worsening, the first of equals
    ]
    # an output without worst records for the failed metric: no such section
    cosine_only = OutputResult("y", {"sqnr": 12.0}, worst_records={"cosine": [(3, 0.5)]})
    assert "Worst records" not in failure_message("net", [first], _result([cosine_only]))


def test_on_inside_an_output_name() -> None:
    """Only the last `` on `` separates the deployment target: output names may contain it."""
    named = OutputResult("x on tflite", {}, worst_records={"cosine": [(1, 0.25)]})
    outcome = replace(
        _fail("cosine 0.25 < 0.99"), subject="output 'x on tflite'", output="x on tflite", deployment="onnxruntime-avx2"
    )
    assert failure_message("net", [outcome], _result([named])).splitlines()[-2:] == [
        "Worst records (cosine):",
        " record 1: 0.25",
    ]


def test_top_k_rows_for_outputs_that_cannot_be_counted() -> None:
    result = _result([OutputResult("y", {}), OutputResult("boxes", {})])
    why = {"y": "output 'y' float32 (4, 3, 5): not class scores", "boxes": "output 'boxes' int64 (4, 2, 2): labels"}
    stats = OutputStats(topk={}, relative={}, problems=why)
    tolerances = {
        "max_top1_drop": Tolerance("max_top1_drop", 0.01, INI),
        "min_top1_agreement": Tolerance("min_top1_agreement", 0.9, "marker"),
    }
    assert evaluate(result, stats, tolerances, [], "net") == [
        Outcome(
            check="min_top1_agreement",
            kind="tolerance",
            scope="output",
            subject=f"output '{name}'",
            output=name,
            metric="top-1",
            op="",
            threshold=None,
            value=None,
            passed=False,
            source="marker",
            detail=f"min_top1_agreement: cannot count top-1 on {text}",
        )
        for name, text in why.items()
    ]
    counted = OutputStats(topk={"y": _counts(0.0, k3=False)}, relative={}, problems={"boxes": why["boxes"]})
    assert [
        o.target for o in evaluate(result, counted, {"max_top1_drop": Tolerance("max_top1_drop", 0.01, INI)}, [], "net")
    ] == ["output 'y'"]


def test_channel_steps_check() -> None:
    from pytest_qaccuracy.metrics.channels import ChannelReport

    low = ChannelReport(axis=1, scale=1.25, min_steps=0.5, max_steps=256.0, low="4..21", flagged=True)
    wide = ChannelReport(axis=1, scale=0.5, min_steps=8.0, max_steps=40.0, low="", flagged=False)
    outputs = [OutputResult("a", {}, channels=low), OutputResult("b", {}, channels=wide), OutputResult("c", {})]
    assert evaluate(
        _result(outputs), None, {"min_channel_steps": Tolerance("min_channel_steps", 2.0, "marker")}, [], "net"
    ) == [
        Outcome(
            check="min_channel_steps",
            kind="tolerance",
            scope="output",
            subject="output 'a'",
            output="a",
            metric="channel steps",
            op=">=",
            threshold=2.0,
            value=0.5,
            passed=False,
            source="marker",
            detail="channel steps 0.5 < 2 for output 'a' (channels 4..21 of axis 1, scale 1.25)",
        ),
        Outcome(
            check="min_channel_steps",
            kind="tolerance",
            scope="output",
            subject="output 'b'",
            output="b",
            metric="channel steps",
            op=">=",
            threshold=2.0,
            value=8.0,
            passed=True,
            source="marker",
            detail="channel steps 8 >= 2 for output 'b'",
        ),
        Outcome(
            check="min_channel_steps",
            kind="tolerance",
            scope="output",
            subject="output 'c'",
            output="c",
            metric="channel steps",
            op=">=",
            threshold=2.0,
            value=None,
            passed=False,
            source="marker",
            detail="channel steps undefined for output 'c' "
            "(the quantized output has no single scale, or no channel varies)",
        ),
    ]


def test_a_slice_tolerance_replaces_the_pairs_on_that_view() -> None:
    from types import SimpleNamespace

    outputs = [OutputResult("boxes", {"sqnr": 15.0}), OutputResult("scores", {"sqnr": 15.0})]
    views = [SimpleNamespace(name="boxes", tolerances=[("min_sqnr", 10.0), ("max_lsb", 1.0)], rules=[])]
    rows = evaluate(_result(outputs), None, {"min_sqnr": Tolerance("min_sqnr", 20.0, INI)}, [], "net", views)
    assert [(o.target, o.threshold, o.source, o.passed) for o in rows] == [
        ("output 'boxes'", 10.0, "slice 'boxes' min_sqnr=", True),  # max_lsb was not asked for: no row
        ("output 'scores'", 20.0, INI, False),
    ]
    # a tolerance only views set reaches evaluate without a value (with_slice_tolerances): no row elsewhere
    views_only = {"min_sqnr": Tolerance("min_sqnr", None, "slice 'boxes'")}
    nan_rows = evaluate(_result(outputs), None, views_only, [], "net", views)
    assert [o.target for o in nan_rows] == ["output 'boxes'"]


def _agreement(tensors: list[tuple[str, int, int, int]], allowed: int = 1) -> AgreementResult:
    """(tensor, elements, mismatches, max steps) in topological order; the first beyond ``allowed`` diverges."""
    rows = tuple(TensorAgreement(t, i, e, m, s) for i, (t, e, m, s) in enumerate(tensors))
    first = next((r.tensor for r in rows if r.max_steps > allowed or r.max_steps < 0), None)
    return AgreementResult("net.onnx", "tflite", allowed, 4, rows, first)


def test_the_agreement_gate_passes_with_the_worst_tensor_and_adds_no_lines() -> None:
    agreement = _agreement([("a", 10, 0, 0), ("b", 20, 3, 1)])
    assert gate_outcome(agreement, "marker") == Outcome(
        check="max_backend_steps", kind="gate",
        scope="model",
        subject="2 tensors (tflite)", metric="steps vs onnxruntime", op="<=",
        threshold=1.0, value=1.0, passed=True, source="marker",
        detail="integer emulation (tflite) within 1 step of onnxruntime: ok on 2 tensors (max 1 step)",
    )  # fmt: skip
    assert gate_notes(agreement) == []


def test_the_agreement_gate_fails_on_the_first_tensor_beyond_n_steps_and_lists_the_next() -> None:
    rows = [("a", 10, 0, 0), ("b", 8, 2, 3), ("c", 5, 5, -1)]
    rows += [(f"d{i}", 4, 1, 2 + i) for i in range(6)]  # six more beyond 1 step: five shown, then "1 more"
    agreement = _agreement(rows)
    assert gate_outcome(agreement, "ini") == Outcome(
        check="max_backend_steps", kind="gate",
        scope="model",
        subject="tensor 'b' (tflite)", metric="steps vs onnxruntime", op="<=",
        threshold=1.0, value=3.0, passed=False, source="ini",
        detail="integer emulation (tflite) within 1 step of onnxruntime: tensor 'b' (order 1) differs by up to "
        "3 steps, 2 / 8 elements (25%)",
    )  # fmt: skip
    assert gate_notes(agreement) == [
        "Next diverging tensors (> 1 step):",
        " c (order 2): another shape, 5 / 5 elements",
        " d0 (order 3): 2 steps, 1 / 4 elements",
        " d1 (order 4): 3 steps, 1 / 4 elements",
        " d2 (order 5): 4 steps, 1 / 4 elements",
        " d3 (order 6): 5 steps, 1 / 4 elements",
        " ... and 2 more",
        "Tensors that differ: 8 / 9; max 7 steps at 'd5' (4 records)",
    ]


def test_the_agreement_gate_on_a_shape_mismatch_and_on_a_model_without_integer_tensors() -> None:
    shape = gate_outcome(_agreement([("a", 3, 3, -1)], allowed=0), "marker")
    assert (shape.target, shape.value, shape.passed) == ("tensor 'a' (tflite)", None, False)
    assert shape.detail == (
        "integer emulation (tflite) within 0 steps of onnxruntime: "
        "tensor 'a' (order 0) has another shape on onnxruntime"
    )
    empty = gate_outcome(_agreement([]), "marker")
    assert (empty.target, empty.value, empty.passed) == ("integer tensors", None, False)
    assert empty.detail.endswith(": the model has no 8-bit tensors to compare")
    only = _agreement([("a", 10, 10, 4)])
    assert gate_notes(only) == ["Tensors that differ: 1 / 1; max 4 steps at 'a' (4 records)"]  # no "next" header


def test_failure_message_escapes_control_characters_of_names() -> None:
    """pytest prints the message as it is: a tensor named with an escape sequence (or a bell) must
    reach the terminal escaped, in the first line, the other failures and the layer lists alike."""
    first = _fail("sqnr 12 dB < 20 dB for layer 'relu\x1b]0;pwned\x07'")
    layers = [_layer("a\x1b[2J", 0, "Conv", sqnr=40.0), _layer("b", 1, "Relu", sqnr=20.0)]
    result = _result([OutputResult("y", {"sqnr": 12.0})], layers)
    message = failure_message("net\x1b[1m", [first, _fail("also 'x\x1b[2J'")], result)
    assert "\x1b" not in message and "\x07" not in message
    lines = message.splitlines()
    assert lines[0] == "sqnr 12 dB < 20 dB for layer 'relu\\x1b]0;pwned\\x07' (pair 'net\\x1b[1m')"
    assert " also 'x\\x1b[2J'" in lines and " a\\x1b[2J (Conv): undefined" in lines  # cosine not measured


def test_task_metric_tolerances_each_give_one_row() -> None:
    """min:/max: read the quantized side, max_drop: the drop in the metric's own direction; a value no
    metric computes, or one side without a value, fails with the reason; NaN bounds (views only) and
    other tolerances are not task checks."""
    from pytest_qaccuracy.analysis.checks import _task_checks
    from pytest_qaccuracy.analysis.outputs import TaskValue

    cer = TaskValue("cer", "ctc", "targets", 10, False, 0.25, 0.375)
    exact = TaskValue("exact_match", "ctc", "fp32", 8, True, 0.75, 0.5)
    empty = TaskValue("f1", "binary_f1", "targets", 4, True, 0.5, None)
    stats = OutputStats(topk={}, relative={}, task={"cer": cer, "exact_match": exact, "f1": empty})
    tolerances = {
        "max_drop:cer": Tolerance("max_drop:cer", 0.0625, "ini"),
        "min:exact_match": Tolerance("min:exact_match", 0.25, "marker"),
        "max:cer": Tolerance("max:cer", 0.25, "suite"),
        "max_drop:f1": Tolerance("max_drop:f1", 0.5, "ini"),
        "min:f1": Tolerance("min:f1", 0.5, "ini"),
        "min:recall": Tolerance("min:recall", 0.5, "ini"),
        "min_cosine": Tolerance("min_cosine", 0.99, "ini"),
        "max_drop:exact_match": Tolerance("max_drop:exact_match", None, "view"),
    }
    rows = {(r.check, r.source): r for r in _task_checks(stats, tolerances)}
    assert list(rows) == [
        ("max_drop:cer", "ini"),
        ("min:exact_match", "marker"),
        ("max:cer", "suite"),
        ("max_drop:f1", "ini"),
        ("min:f1", "ini"),
        ("min:recall", "ini"),
    ]
    drop = rows["max_drop:cer", "ini"]
    assert (drop.target, drop.metric, drop.op, drop.value, drop.threshold, drop.passed) == (
        "task 'cer'",
        "cer drop",
        "<=",
        0.125,
        0.0625,
        False,
    )
    assert drop.detail == (
        "cer drop 0.125 > 0.0625 for task 'cer' (fp32 0.25, quantized 0.375; against the targets, 10 records)"
    )
    low = rows["min:exact_match", "marker"]
    assert (low.metric, low.op, low.value, low.passed) == ("exact_match", ">=", 0.5, True)
    assert low.detail == (
        "exact_match 0.5 >= 0.25 for task 'exact_match' (fp32 0.75, quantized 0.5; against the fp32 predictions, "
        "8 records)"
    )
    high = rows["max:cer", "suite"]
    assert (high.value, high.passed) == (0.375, False)
    assert high.detail.startswith("cer 0.375 > 0.25 for task 'cer' (fp32 0.25, quantized 0.375;")
    assert rows["max_drop:f1", "ini"].detail.startswith(
        "f1 drop undefined for task 'f1' (nothing to count on the fp32 or the quantized side) (fp32 0.5, quantized "
    )
    assert rows["min:f1", "ini"].detail.startswith(
        "f1 undefined for task 'f1' (nothing to count on the quantized side) (fp32 0.5,"
    )
    assert not rows["min:f1", "ini"].passed and rows["min:f1", "ini"].value is None
    missing = rows["min:recall", "ini"]
    assert (missing.metric, missing.op, missing.value, missing.threshold, missing.passed) == (
        "recall",
        ">=",
        None,
        None,
        False,
    )
    assert missing.detail == (
        "min:recall: no task metric computes 'recall' (computed: cer, exact_match, f1); name one in task_metrics"
    )
    none = _task_checks(None, {"max_drop:cer": Tolerance("max_drop:cer", 0.1, "ini")})
    assert [r.detail for r in none] == [
        "max_drop:cer: no task metric computes 'cer' (computed: none); name one in task_metrics"
    ]
    assert none[0].metric == "cer drop" and none[0].op == "<="


def _task(name: str, fp32: float | None, quantized: float | None, **fields) -> TaskValue:
    values = {"metric": "mymod:Metric", "against": "targets", "records": 12, "higher_is_better": True}
    return TaskValue(name, **{**values, **fields}, fp32=fp32, quantized=quantized)


def _task_rows(task: dict[str, TaskValue], tolerances: dict[str, float], whole: bool = False) -> list[Outcome]:
    stats = OutputStats(topk={}, relative={}, task=task)
    tols = {name: Tolerance(name, value, INI) for name, value in tolerances.items()}
    return evaluate(_result([]), stats, tols, [], "net", whole=whole)


def test_task_checks_compare_each_side_and_the_drop_in_the_metrics_direction() -> None:
    """``min:``/``max:`` read the quantized side, ``max_drop:`` fp32 minus quantized when higher is
    better and quantized minus fp32 when lower is (here 0.90 -> 0.85: a drop of 0.05; CER 0.10 -> 0.16:
    a drop of 0.06)."""
    task = {
        "acc": _task("acc", 0.90, 0.85),
        "cer": _task("cer", 0.10, 0.16, higher_is_better=False, against="fp32", records=7),
    }
    rows = _task_rows(task, {"min:acc": 0.86, "max_drop:acc": 0.06, "max:cer": 0.2, "max_drop:cer": 0.05})
    by_check = {row.check: row for row in rows}
    assert [row.check for row in rows] == ["min:acc", "max_drop:acc", "max:cer", "max_drop:cer"]
    assert by_check["min:acc"] == Outcome(
        kind="task",
        check="min:acc",
        scope="task",
        subject="task 'acc'",
        metric="acc",
        op=">=",
        threshold=0.86,
        value=0.85,
        passed=False,
        source=INI,
        detail="acc 0.85 < 0.86 for task 'acc' (fp32 0.9, quantized 0.85; against the targets, 12 records)",
    )
    drop = by_check["max_drop:acc"]
    assert (drop.metric, drop.op, drop.passed) == ("acc drop", "<=", True) and abs(drop.value - 0.05) < 1e-12
    assert by_check["max:cer"].passed and by_check["max:cer"].value == 0.16
    cer_drop = by_check["max_drop:cer"]
    assert not cer_drop.passed and abs(cer_drop.value - 0.06) < 1e-12
    assert cer_drop.detail.endswith("(fp32 0.1, quantized 0.16; against the fp32 predictions, 7 records)")


def test_task_checks_of_a_missing_or_broken_metric_fail_with_one_line() -> None:
    """A value no metric computes names the computed ones; a metric that raised fails its gated checks
    with its line; with ``whole`` (one check of the whole pair) an ungated broken metric fails once."""
    broken = _task("boom", None, None, metric="mymod:Boom", error="task metric 'mymod:Boom' on records 0..7: E")
    other = _task("bang", None, None, metric="mymod:Bang", error="task metric 'mymod:Bang' on records 8..15: F")
    task = {"acc": _task("acc", 0.9, 0.9), "boom": broken, "bang": other}
    rows = _task_rows(task, {"min:nothing": 0.5, "max_drop:boom": 0.1})
    assert rows[0] == Outcome(
        kind="task",
        check="min:nothing",
        scope="task",
        subject="task 'nothing'",
        metric="nothing",
        op=">=",
        threshold=None,
        value=None,
        passed=False,
        source=INI,
        detail="min:nothing: no task metric computes 'nothing' (computed: acc, boom, bang); name one in task_metrics",
    )
    assert rows[1] == Outcome(
        kind="task",
        check="max_drop:boom",
        scope="task",
        subject="task 'boom'",
        metric="boom drop",
        op="<=",
        threshold=0.1,
        value=None,
        passed=False,
        source=INI,
        detail="max_drop:boom: task metric 'mymod:Boom' on records 0..7: E",
    )
    assert len(rows) == 2  # one suite item: the ungated metric is not its check
    whole = _task_rows(task, {"max_drop:boom": 0.1}, whole=True)
    assert whole[1:] == [
        Outcome(
            kind="task",
            check="task_metrics",
            scope="task",
            subject="task metric 'mymod:Bang'",
            metric="error",
            op="",
            threshold=None,
            value=None,
            passed=False,
            source="task_metrics",
            detail="task metric 'mymod:Bang' on records 8..15: F",
        )
    ]
    assert _task_rows({}, {"min:acc": 0.5})[0].detail.endswith("(computed: none); name one in task_metrics")
    assert _task_rows(task, {}, whole=True)[0].subject == "task metric 'mymod:Boom'"  # ungated: both fail
    assert len(_task_rows(task, {}, whole=True)) == 2


def test_task_checks_of_a_value_with_nothing_to_count_say_which_side() -> None:
    rows = _task_rows({"acc": _task("acc", None, 0.5)}, {"max_drop:acc": 0.1, "min:acc": 0.4})
    assert not rows[0].passed and rows[0].value is None
    assert rows[0].detail.startswith("acc drop undefined for task 'acc' (nothing to count on the fp32 or the quantized")
    assert rows[1].passed and rows[1].value == 0.5


def test_checks_on_a_target_are_its_output_and_task_checks_named_so() -> None:
    """``on_target``: a deployment target's run keeps its output and task checks (not rules or layers),
    each marked with the preset and the preset in its line."""
    from pytest_qaccuracy.analysis.checks import on_target

    output = _fail("cosine 0.5 < 0.99 for output 'y'")
    task = _task_rows({"acc": _task("acc", 0.9, 0.8)}, {"min:acc": 0.85})[0]
    layer = replace(output, scope="layer", check="rules")
    marked = on_target([output, layer, task], "onnxruntime-vnni")
    assert [(o.check, o.deployment) for o in marked] == [
        ("min_cosine", "onnxruntime-vnni"),
        ("min:acc", "onnxruntime-vnni"),
    ]
    assert marked[0].detail == "cosine 0.5 < 0.99 for output 'y' on onnxruntime-vnni"
    assert marked[1] == replace(task, deployment="onnxruntime-vnni", detail=task.detail + " on onnxruntime-vnni")
