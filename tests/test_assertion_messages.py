"""The assertion helpers' whole failure messages, boundaries and edge cases (``assertions.py``).

Inputs are small dyadic arrays, so each expected figure below was worked out by hand: the message
layout is the one docs/pytest.md shows (numpy's: the rule, ``Tolerance from:``, then sections).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy import assertions
from pytest_qaccuracy.analysis.checks import evaluate
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.assertions import assert_cosine, assert_relative, assert_topk, assert_within_lsb, fmt
from pytest_qaccuracy.model.pair import ModelPair
from pytest_qaccuracy.tolerances import Tolerance


def _message(call, *args, **kwargs) -> list[str]:
    with pytest.raises(AssertionError) as info:
        call(*args, **kwargs)
    return str(info.value).splitlines()


def test_cosine_message() -> None:
    actual = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    expected = np.array([[1.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    # per record 1, 0, 1; overall 26 / sqrt(27 * 27) = 0.962963
    assert _message(assert_cosine, actual, expected, 0.99, name="y", source="marker") == [
        "cosine 0.962963 < 0.99 for output 'y'",
        "Tolerance from: marker",
        "",
        "Worst records (cosine):",
        " record 1: 0",
        " record 0: 1",
        " record 2: 1",
        "",
        "Worst elements:",
        " [1, 0]: 0 (ACTUAL), 1 (EXPECTED)",
        " [1, 1]: 1 (ACTUAL), 0 (EXPECTED)",
        " [0, 0]: 1 (ACTUAL), 1 (EXPECTED)",
        " [0, 1]: 0 (ACTUAL), 0 (EXPECTED)",
        " [2, 0]: 3 (ACTUAL), 3 (EXPECTED)",
    ]


def test_cosine_of_a_vector_is_one_record() -> None:
    lines = _message(assert_cosine, np.array([1.0, 0.0]), np.array([0.0, 1.0]), 0.5)
    assert lines[0] == "cosine 0 < 0.5 for output"
    assert lines[lines.index("Worst records (cosine):") :][:3] == ["Worst records (cosine):", " record 0: 0", ""]
    assert lines[-2:] == [" [0]: 1 (ACTUAL), 0 (EXPECTED)", " [1]: 0 (ACTUAL), 1 (EXPECTED)"]


def test_cosine_boundaries_zeros_and_rounding() -> None:
    assert assert_cosine(np.array([[3.0, 4.0]]), np.array([[3.0, 4.0]]), 1.0) == 1.0  # at the bound: passes
    zeros = np.zeros((2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0/0 must not warn
        assert assert_cosine(zeros, zeros, 1.0) == 1.0  # both silent: identical
        # one silent: undefined, a failure whatever the bound (a record alone: 0, nothing in common)
        lines = _message(assert_cosine, zeros, np.ones((2, 3)), -1.0, name="y")
        assert lines[:5] == [
            "cosine undefined for output 'y' (the quantized tensor is all zeros)",
            "",
            "Worst records (cosine):",
            " record 0: 0",
            " record 1: 0",
        ]
        assert _message(assert_cosine, np.ones((2, 3)), zeros, 0.0)[0] == (
            "cosine undefined for output (the fp32 tensor is all zeros)"
        )
        lines = _message(assert_cosine, np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 0.0], [0.0, 1.0]]), 0.5)
    assert lines[2:5] == ["Worst records (cosine):", " record 1: 0", " record 0: 1"]
    # -a is a negative multiple of e whose cosine rounds past -1: reported (and compared) as exactly -1
    e = np.array([-0.535669373161111, 0.36159505490948474, 1.3040000451301372])
    a = np.array([-3.9221796962164084, 2.647604760841311, 9.54790913412261])
    assert assert_cosine(-a, e, -1.0) == -1.0


def test_cosine_of_nan_is_undefined() -> None:
    lines = _message(assert_cosine, np.array([[1.0, np.nan]]), np.array([[1.0, 1.0]]), 0.5, name="y")
    assert lines[0] == "cosine undefined for output 'y' (NaN or Inf in the compared values)"


def _mul_model(path: Path, weight: np.ndarray) -> Path:
    """``y = x * weight`` on records of 4 floats."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        "mul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(weight.astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(
    ("fp32_weight", "quantized_weight", "expected"),
    [
        ([0, 0, 0, 0], [0, 0, 0, 0], "cosine 1 >= -1 for output 'y'"),
        ([0, 0, 0, 0], [1, 2, 3, 4], "cosine undefined for output 'y' (the fp32 tensor is all zeros)"),
        ([1, 2, 3, 4], [0, 0, 0, 0], "cosine undefined for output 'y' (the quantized tensor is all zeros)"),
        ([1, 2, 3, 4], [-1, -2, -3, -4], "cosine -1 >= -1 for output 'y'"),
    ],
)
def test_cosine_assertion_agrees_with_the_plugin_check(tmp_path, fp32_weight, quantized_weight, expected) -> None:
    """The plugin's ``min_cosine`` on a pair and ``assert_cosine`` on the pair's outputs: same verdict, same words."""
    records = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    np.savez(tmp_path / "d.npz", x=records)
    fp32 = _mul_model(tmp_path / "f.onnx", np.array(fp32_weight))
    quantized = _mul_model(tmp_path / "q.onnx", np.array(quantized_weight))
    result = compare(ModelPair(fp32, quantized), tmp_path / "d.npz", metrics="cosine", layers=False)
    (outcome,) = evaluate(result, None, {"min_cosine": Tolerance("min_cosine", -1.0, "marker")}, [], "pair")
    assert outcome.detail == expected
    actual = records * np.array(quantized_weight, np.float32)
    reference = records * np.array(fp32_weight, np.float32)
    if outcome.passed:
        assert assert_cosine(actual, reference, -1.0, name="y") == outcome.value
    else:
        assert _message(assert_cosine, actual, reference, -1.0, name="y")[0] == expected


def test_cosine_of_integer_outputs_does_not_overflow() -> None:
    q = np.array([[100, 100]], dtype=np.int8)
    assert assert_cosine(q, q, 1.0) == 1.0
    lines = _message(assert_cosine, np.array([[100, 1]], np.int8), np.array([[-28, 0]], np.int8), 0.5)
    assert lines[-2:] == [" [0, 0]: 100 (ACTUAL), -28 (EXPECTED)", " [0, 1]: 1 (ACTUAL), 0 (EXPECTED)"]


def test_relative_message() -> None:
    actual = np.array([[1.5, 2.625], [3.5, 4.5]])
    expected = np.array([[1.0, 2.0], [2.0, 4.0]])
    # tolerance 0.125 + 0.25*|e| = 0.375, 0.625, 0.625, 1.125; |a - e| = 0.5, 0.625 (at the bound), 1.5, 0.5
    assert _message(assert_relative, actual, expected, rtol=0.25, atol=0.125, name="y", source="ini") == [
        "2 / 4 elements (50%) outside atol + rtol*|expected| (rtol=0.25, atol=0.125) for output 'y'",
        "Tolerance from: ini",
        "",
        "Max absolute difference among violations: 1.5",
        "Max relative difference among violations: 0.75",
        "",
        "Worst elements:",
        " [1, 0]: 3.5 (ACTUAL), 2 (EXPECTED)",
        " [0, 0]: 1.5 (ACTUAL), 1 (EXPECTED)",
    ]
    assert assert_relative(actual, expected, rtol=0.25, atol=0.125, max_fraction=0.5) == 0.5


def test_relative_zero_reference_allowed_share_and_nan() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dividing by a zero reference (0.5/0, 0/0) must not warn
        lines = _message(
            assert_relative, np.array([0.5, 1.0, 1.0, 0.0]), np.array([0.0, 1.0, 1.0, 0.0]), 0.5, 0.0, 0.125
        )
    assert lines == [
        "1 / 4 elements (25%) outside atol + rtol*|expected| (rtol=0.5, atol=0) (at most 12.5% allowed) for output",
        "",
        "Max absolute difference among violations: 0.5",
        "Max relative difference among violations: inf",
        "",
        "Worst elements:",
        " [0]: 0.5 (ACTUAL), 0 (EXPECTED)",
    ]
    lines = _message(assert_relative, np.array([1.0, np.nan, 3.0]), np.ones(3), rtol=0.0)
    assert lines[-3:] == ["Worst elements:", " [1]: nan (ACTUAL), 1 (EXPECTED)", " [2]: 3 (ACTUAL), 1 (EXPECTED)"]
    # one element: 1 of 1 is the whole output
    with pytest.raises(AssertionError, match=r"^1 / 1 elements \(100%\)"):
        assert_relative(np.array([2.0]), np.array([1.0]), rtol=0.0, max_fraction=0.75)
    # integer outputs: differences taken in float64, not wrapped around in int8
    with pytest.raises(AssertionError, match="Max absolute difference among violations: 200"):
        assert_relative(np.array([100], np.int8), np.array([-100], np.int8), rtol=0.0)


# Records x = 1, 2, 4 of y = x * weight. Zeros: |q - f| = x * [1, 0, 0.5, 0] against the bound
# 0.25 * x * [0, 1, 1, 2]: columns 0 (relative inf, excess x) and 2 (relative 0.5, excess 0.25 x) are
# out; excess 4, 2, then a tie at 1 ([0, 0] before [2, 2]), then 0.5. NaN and inf (atol 0.5 alone):
# columns 0 (NaN), 2 (inf against the bound 0.5 + 0 * inf, NaN) and 3 (inf, relative inf) are out,
# each by an excess of inf (NaN counts as inf), so listed in order; the maxima are NaN.
RELATIVE_CASES = {
    "zeros and a tie": (
        ([0, 1, 1, 2], [1, 1, 1.5, 2], {"rtol": 0.25}),
        ("6 / 12", "4", "inf"),
        [(2, 0, "4", "0"), (1, 0, "2", "0"), (0, 0, "1", "0"), (2, 2, "6", "4"), (1, 2, "3", "2")],
    ),
    "NaN and inf": (
        ([1, 1, np.inf, 1], [np.nan, 1, 1, np.inf], {"atol": 0.5}),
        ("9 / 12", "nan", "nan"),
        [(0, 0, "nan", "1"), (0, 2, "1", "inf"), (0, 3, "inf", "1"), (1, 0, "nan", "2"), (1, 2, "2", "inf")],
    ),
}


@pytest.mark.parametrize("case", list(RELATIVE_CASES))
def test_relative_assertion_agrees_with_the_plugin_check(tmp_path, case: str) -> None:
    """``assert_relative`` on the outputs and the plugin's ``rtol``/``atol`` check on the pair (its
    statistics folded over batches of 2 records) find the same elements and the same differences."""
    from pytest_qaccuracy.analysis.outputs import measure_outputs
    from pytest_qaccuracy.plugin.checks import failure_message
    from pytest_qaccuracy.runtime import RuntimeOptions

    (fp32_weight, quantized_weight, given), (count, max_abs, max_rel), worst = RELATIVE_CASES[case]
    rtol, atol = given.get("rtol", 0.0), given.get("atol", 0.0)
    records = np.array([[1.0] * 4, [2.0] * 4, [4.0] * 4], np.float32)
    maxima = [
        f"Max absolute difference among violations: {max_abs}",
        f"Max relative difference among violations: {max_rel}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf - inf, 0 * inf and x / 0 must not warn
        lines = _message(assert_relative, records * quantized_weight, records * fp32_weight, rtol, atol, name="y")
    assert lines[0].startswith(f"{count} elements")
    rows = [f" [{r}, {i}]: {q} (ACTUAL), {f} (EXPECTED)" for r, i, q, f in worst]
    assert lines[2:] == [*maxima, "", "Worst elements:", *rows]

    np.savez(tmp_path / "d.npz", x=records)
    fp32, quantized = (
        _mul_model(tmp_path / "f.onnx", np.array(fp32_weight)),
        _mul_model(tmp_path / "q.onnx", np.array(quantized_weight)),
    )
    result = compare(ModelPair(fp32, quantized), tmp_path / "d.npz", metrics="cosine", layers=False)
    stats = measure_outputs(
        ModelPair(fp32, quantized), tmp_path / "d.npz", rtol=rtol, atol=atol, options=RuntimeOptions(batch_size=2)
    )
    tolerances = {name: Tolerance(name, value, "marker") for name, value in given.items()}
    (outcome,) = evaluate(result, stats, tolerances, [], "pair")
    message = failure_message("pair", [outcome], result, stats).splitlines()
    assert message[0].startswith(f"{count} elements")
    rows = [f" record {r} [{i}]: {q} (ACTUAL), {f} (EXPECTED)" for r, i, q, f in worst]
    assert message[message.index(maxima[0]) :] == [*maxima, "Worst elements:", *rows]


def _topk_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    reference = np.array([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0], [2.0, 1.0, 3.0]])  # fp32 top-1: 0, 1, 2
    actual = np.array([[3.0, 2.0, 1.0], [3.0, 1.0, 2.0], [2.0, 3.0, 0.0]])  # top-2: [0, 1], [0, 2], [1, 0]
    return actual, reference, np.array([0, 1, 0])


def test_topk_message() -> None:
    actual, reference, labels = _topk_case()
    # agreement@2: only record 0 keeps its fp32 winner in the top 2; accuracy@2: fp32 3/3, quantized 2/3
    assert _message(
        assert_topk, actual, reference, 2, 0.5, 0.25, labels, name="logits", source="marker"
    ) == [
        "top-2 agreement 0.333333 < 0.5 for output 'logits'",
        "Tolerance from: marker",
        "",
        "top-2 accuracy drop 0.333333 > 0.25 for output 'logits' (fp32 1, quantized 0.666667)",
        "",
        "2 / 3 records disagree",
        "",
        "Worst records:",
        " record 2: fp32 top-1 class 2, quantized top-2 [1, 0]",  # its winner fell by 3, record 1's by 2
        " record 1: fp32 top-1 class 1, quantized top-2 [0, 2]",
    ]  # fmt: skip


def test_topk_boundaries_and_default_k() -> None:
    reference = np.eye(4) + 0.5
    actual = reference.copy()
    actual[3] = [1.0, 0.0, 0.0, 0.0]  # record 3 now says class 0
    labels = np.arange(4)
    counter = assert_topk(actual, reference, min_agreement=0.75, max_accuracy_drop=0.25, labels=labels)
    assert counter.ks == (1,) and counter.agreement(1) == 0.75 and counter.drop(1) == 0.25
    with pytest.raises(AssertionError, match=r"^top-1 agreement 0.75 < 0.875 for output\n"):
        assert_topk(actual, reference, min_agreement=0.875)


def test_topk_argument_errors() -> None:
    scores = np.eye(3)
    with pytest.raises(ValueError, match=r"^assert_topk needs min_agreement or max_accuracy_drop$"):
        assert_topk(scores, scores)
    with pytest.raises(ValueError, match=r"^max_accuracy_drop needs labels$"):
        assert_topk(scores, scores, max_accuracy_drop=0.1)
    with pytest.raises(ValueError, match=r"^shape mismatch: actual \(3, 3\), reference \(2, 3\)$"):
        assert_topk(scores, scores[:2], min_agreement=0.5)


def test_within_lsb_message_per_channel_integers() -> None:
    q = np.array([[10, -3], [0, 5]], dtype=np.int8)
    scale, zero_point = np.array([0.5, 0.25]), np.array([2, -1])
    dequantized = np.array([[4.0, -0.5], [-1.0, 1.5]])  # (q - zero_point) * scale, by column
    assert assert_within_lsb(q, dequantized, scale, 0, zero_point=zero_point) == 0.0
    reference = np.array([[4.5, -0.5], [-1.0, 1.0]])  # 1 step off (allowed), and 2 steps off
    assert _message(assert_within_lsb, q, reference, scale, 1, zero_point=zero_point, name="y", source="marker") == [
        "lsb 2 > 1 for output 'y'",
        "Tolerance from: marker",
        "",
        "1 / 4 elements (25%) more than 1 steps away",
        "",
        "Worst elements:",
        " [1, 1]: 1.5 (ACTUAL), 1 (EXPECTED)",
    ]
    # one zero point for every channel
    assert assert_within_lsb(q, np.array([[4.0, -1.25], [-1.0, 0.75]]), scale, 0, zero_point=2) == 0.0


def test_within_lsb_shapes_scales_and_defaults() -> None:
    assert assert_within_lsb(1.0, 1.25, 0.5) == 0.5  # scalars
    assert assert_within_lsb(np.zeros(0), np.zeros(0), 0.5) == 0.0  # nothing to compare
    # a per-element scale along axis 0 of a vector: 0/0.25 and 0.5/0.5 steps
    assert assert_within_lsb(np.array([1.0, 2.0]), np.array([1.0, 2.5]), np.array([0.25, 0.5]), axis=0) == 1.0
    with pytest.raises(AssertionError, match=r"^lsb 2 > 1 for output"):
        assert_within_lsb(np.array([1.0]), np.array([2.0]), 0.5)  # default max_lsb is 1
    with pytest.raises(ValueError, match=r"^scale must be positive, got 0$"):
        assert_within_lsb(np.ones(2), np.ones(2), 0)
    with pytest.raises(ValueError, match=r"^shape mismatch: actual \(2,\), reference \(3,\)$"):
        assert_within_lsb(np.ones(2), np.ones(3), 1.0)
    with pytest.raises(ValueError, match=r"^shape mismatch: actual \(2,\), expected \(3,\)$"):
        assert_cosine(np.ones(2), np.ones(3), 0.5)


def test_nan_is_infinitely_many_steps_away_and_listed_first() -> None:
    """A NaN output is the worst element: it is listed, first, next to the other violations."""
    lines = _message(assert_within_lsb, np.array([np.nan, 3.0, 1.0]), np.array([1.0, 1.0, 1.0]), 0.5)
    assert lines == [
        "lsb inf > 1 for output",
        "",
        "2 / 3 elements (66.6667%) more than 1 steps away",
        "",
        "Worst elements:",
        " [0]: nan (ACTUAL), 1 (EXPECTED)",
        " [1]: 3 (ACTUAL), 1 (EXPECTED)",
    ]


def test_fmt() -> None:
    assert fmt(None) == "undefined"
    assert fmt(np.float32(0.1)) == "0.1" and fmt(1234567.0) == "1.23457e+06"


@pytest.mark.parametrize(
    ("helper", "args"),
    [
        (assert_cosine, (np.ones(2), -np.ones(2), 0.5)),
        (assert_relative, (np.ones(2), -np.ones(2), 0.0)),
        (assert_topk, (np.eye(2), np.eye(2)[::-1], 1, 1.0)),
        (assert_within_lsb, (np.ones(2), -np.ones(2), 0.5)),
    ],
)
def test_helper_frames_are_hidden_from_pytest_tracebacks(helper, args) -> None:
    """pytest leaves out frames whose ``__tracebackhide__`` is true: the failure points at the test."""
    with pytest.raises(AssertionError) as info:
        helper(*args)
    frames, tb = [], info.tb
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == assertions.__file__:
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    assert frames and all(frame.f_locals.get("__tracebackhide__") is True for frame in frames)


def test_cosine_message_of_partial_and_one_sided_records() -> None:
    actual = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    expected = np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    # record 0: 2 / sqrt(2 * 4) = 0.707107; record 1: only actual is non-zero: 0; record 2: both zero: 1
    lines = _message(assert_cosine, actual, expected, 0.9)
    assert lines[2:6] == ["Worst records (cosine):", " record 1: 0", " record 0: 0.707107", " record 2: 1"]


def test_relative_worst_elements_rank_by_the_excess_over_each_tolerance() -> None:
    # rtol 0.5: element 0 is 1 off a tolerance of 0.875 (0.125 over), element 1 0.625 off 0.125 (0.5 over)
    lines = _message(assert_relative, np.array([2.75, 0.875]), np.array([1.75, 0.25]), rtol=0.5)
    assert lines[-3:] == [
        "Worst elements:",
        " [1]: 0.875 (ACTUAL), 0.25 (EXPECTED)",
        " [0]: 2.75 (ACTUAL), 1.75 (EXPECTED)",
    ]


def test_topk_lists_a_single_disagreeing_record() -> None:
    reference = np.array([[2.0, 1.0], [1.0, 2.0]])
    actual = np.array([[2.0, 1.0], [2.0, 1.0]])  # record 1 now says class 0
    lines = _message(assert_topk, actual, reference, 1, 1.0)
    assert lines[-4:] == [
        "1 / 2 records disagree",
        "",
        "Worst records:",
        " record 1: fp32 top-1 class 1, quantized top-1 [0]",
    ]


def test_within_lsb_per_channel_on_the_first_axis() -> None:
    q = np.array([[3, 5], [3, 5], [3, 5]], dtype=np.int8)
    scale, zero_point = np.array([0.5, 0.25, 1.0]), np.array([1, -1, 0])
    dequantized = np.array([[1.0, 2.0], [1.0, 1.5], [3.0, 5.0]])  # (q - zero_point) * scale, by row
    assert assert_within_lsb(q, dequantized, scale, 0, zero_point=zero_point, axis=0) == 0.0
    # a float output with a step per row: 0.5 off is 1 step in row 0, 2 steps in row 1, 0.5 in row 2
    assert assert_within_lsb(dequantized + 0.5, dequantized, scale, 2, axis=0) == 2.0


def test_topk_drop_without_a_disagreeing_record_lists_none() -> None:
    """Every record keeps its fp32 winner (class 0) in the quantized top 2, yet the labelled class 1
    leaves it: accuracy@2 drops from 1 to 0 with no record to show."""
    reference = np.array([[0.5, 0.4, 0.1], [0.5, 0.4, 0.1]])
    actual = np.array([[0.5, 0.1, 0.4], [0.5, 0.1, 0.4]])
    assert _message(assert_topk, actual, reference, 2, None, 0.25, np.array([1, 1]), name="logits") == [
        "top-2 accuracy drop 1 > 0.25 for output 'logits' (fp32 1, quantized 0)",
        "",
        "0 / 2 records disagree",
    ]


# -- ties: the documented order (the lower index first), pinned on inputs where numpy's default sort
# (its SIMD sorts, numpy 2) does not keep equal keys in order


def _section(lines: list[str], title: str) -> list[str]:
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return lines[start:end]


def test_tied_worst_elements_and_records_are_listed_in_index_order() -> None:
    expected = np.zeros((64, 2))
    actual = expected + np.tile([1.0, 2.0, 3.0, 4.0], 32).reshape(64, 2)  # errors 1, 2, 3, 4 repeating
    lines = _message(assert_relative, actual, expected, 0.5, atol=0.1)
    # the largest excess (4 - 0.1) is at every flat index 3 (mod 4): [1, 1], [3, 1], [5, 1], ...
    assert _section(lines, "Worst elements:") == [f" [{r}, 1]: 4 (ACTUAL), 0 (EXPECTED)" for r in (1, 3, 5, 7, 9)]
    cosines = np.tile([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]], (16, 1))  # cosine 1, 0, 0.707, -1
    lines = _message(assert_cosine, cosines, np.tile([1.0, 0.0], (64, 1)), 0.99)
    assert _section(lines, "Worst records (cosine):") == [f" record {r}: -1" for r in (3, 7, 11, 15, 19)]


def test_tied_disagreements_are_listed_in_record_order() -> None:
    reference = np.tile([[0.0, 1.0, 0.0]], (64, 1))  # fp32 top-1: class 1 everywhere
    test = np.tile([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [2.0, 0.0, 1.0], [0.0, 1.0, 0.0]], (16, 1))
    lines = _message(assert_topk, test, reference, k=1, min_agreement=1.0)
    # margins 1 (records 0, 4, ...) and 2 (records 2, 6, ...): the larger first, ties by record
    assert _section(lines, "Worst records:") == [
        f" record {r}: fp32 top-1 class 1, quantized top-1 [0]" for r in (2, 6, 10, 14, 18)
    ]
