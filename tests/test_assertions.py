"""The assertion helpers: pass/fail boundaries and the layout of their failure messages."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pytest_qaccuracy.assertions import assert_cosine, assert_relative, assert_topk, assert_within_lsb
from pytest_qaccuracy.metrics.topk import TopKCounter, as_scores, topk_counter, topk_indices


def _scores(records: int = 200, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((records, classes)).astype(np.float32)


def test_cosine_passes_and_returns_value() -> None:
    ref = _scores()
    assert assert_cosine(ref + 1e-3, ref, 0.999) > 0.999


def test_cosine_failure_message_layout() -> None:
    ref = _scores()
    test = ref.copy()
    test[7] = -test[7]  # one record flipped: it is the worst record
    with pytest.raises(AssertionError) as info:
        assert_cosine(test, ref, 0.999, name="logits", source="marker")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("cosine 0.9") and lines[0].endswith("< 0.999 for output 'logits'")
    assert lines[1] == "Tolerance from: marker"
    assert "Worst records (cosine):" in lines
    assert lines[lines.index("Worst records (cosine):") + 1] == " record 7: -1"
    worst = lines[lines.index("Worst elements:") + 1]
    assert worst.startswith(" [7, ") and "(ACTUAL)" in worst


def test_relative_counts_violations_and_max_fraction() -> None:
    ref = np.ones((4, 5))
    test = ref.copy()
    test[2, 3] = 1.5
    assert assert_relative(test, ref, rtol=0.6) == 0.0
    assert assert_relative(test, ref, rtol=0.01, max_fraction=0.05) == pytest.approx(0.05)
    with pytest.raises(AssertionError) as info:
        assert_relative(test, ref, rtol=0.01, atol=0.1)
    text = str(info.value)
    assert (
        text.splitlines()[0] == "1 / 20 elements (5%) outside atol + rtol*|expected| (rtol=0.01, atol=0.1) for output"
    )
    assert "Max absolute difference among violations: 0.5" in text
    assert " [2, 3]: 1.5 (ACTUAL), 1 (EXPECTED)" in text


def test_relative_nan_is_a_violation() -> None:
    ref = np.ones(3)
    with pytest.raises(AssertionError, match="1 / 3 elements"):
        assert_relative(np.array([1.0, np.nan, 1.0]), ref, rtol=1.0, atol=1.0)


def test_topk_agreement_and_glow_drop() -> None:
    ref = _scores(200)
    labels = ref.argmax(axis=1)
    test = ref.copy()
    test[:3] = -test[:3]  # 3 of 200 records lose their top-1 class
    counter = assert_topk(test, ref, k=1, min_agreement=0.98, max_accuracy_drop=0.02, labels=labels)
    assert counter.agreement(1) == pytest.approx(197 / 200)
    assert counter.drop(1) == pytest.approx(3 / 200)
    with pytest.raises(AssertionError) as info:
        assert_topk(test, ref, k=1, max_accuracy_drop=0.005, labels=labels, name="logits")
    first = str(info.value).splitlines()[0]
    assert first == "top-1 accuracy drop 0.015 > 0.005 for output 'logits' (fp32 1, quantized 0.985)"
    assert "3 / 200 records disagree" in str(info.value)
    assert "Worst records:" in str(info.value)


def test_topk_k5_is_looser_than_k1() -> None:
    ref = _scores(100)
    test = ref.copy()
    top2 = np.argsort(-ref, axis=1)[:, 1]
    test[np.arange(100), top2] += 10.0  # the runner-up becomes the winner everywhere
    with pytest.raises(AssertionError, match=r"top-1 agreement 0 < 0\.9"):
        assert_topk(test, ref, k=1, min_agreement=0.9)
    assert assert_topk(test, ref, k=5, min_agreement=1.0).agreement(5) == 1.0


def test_topk_agreement_asks_for_the_fp32_winner_among_the_quantized_top_k() -> None:
    """agreement@k: is the fp32 top-1 class among the quantized top-k? Not the other way round."""
    fp32 = np.array([[4.0, 3.0, 2.0, 1.0]])  # top-1 class 0, top-2 {0, 1}
    quantized = np.array([[3.0, 1.0, 4.0, 2.0]])  # top-1 class 2, top-2 {2, 0}
    # fp32's winner (0) is in the quantized top-2; the quantized winner (2) is not in the fp32 top-2
    assert topk_counter(fp32, quantized, (1, 2)).agreement(2) == 1.0
    assert topk_counter(quantized, fp32, (1, 2)).agreement(2) == 0.0
    assert assert_topk(quantized, fp32, k=2, min_agreement=1.0).agreement(2) == 1.0
    with pytest.raises(AssertionError, match=r"top-2 agreement 0 < 1"):
        assert_topk(fp32, quantized, k=2, min_agreement=1.0)


def test_topk_accuracy_drop_is_fp32_minus_quantized() -> None:
    fp32 = np.array([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0]])  # both records right
    quantized = np.array([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]])  # record 1 now says class 2
    labels = np.array([0, 1])
    counter = topk_counter(fp32, quantized, (1,), labels)
    assert counter.accuracy(1) == (1.0, 0.5)
    assert counter.drop(1) == 0.5  # a loss is a positive drop
    assert topk_counter(quantized, fp32, (1,), labels).drop(1) == -0.5  # a gain is negative
    with pytest.raises(AssertionError, match=r"top-1 accuracy drop 0\.5 > 0\.1 .*\(fp32 1, quantized 0\.5\)"):
        assert_topk(quantized, fp32, k=1, max_accuracy_drop=0.1, labels=labels)


def test_topk_ties_go_to_the_lowest_class_index_like_argmax() -> None:
    """Documented in metrics/topk.py (and numpy's argmax, ONE's convention): the lower index wins a tie."""
    scores = np.array([[1.0, 5.0, 5.0, 0.0, 5.0]])
    assert topk_indices(scores, 1).tolist() == [[1]] == [[int(np.argmax(scores[0]))]]
    assert topk_indices(scores, 3).tolist() == [[1, 2, 4]]
    tied = np.array([[3.0, 3.0, 0.0]])
    # label 0: right only if the tie goes to class 0; a quantized model that breaks the tie loses it
    counter = topk_counter(tied, np.array([[2.0, 3.0, 0.0]]), (1,), np.array([0]))
    assert counter.accuracy(1) == (1.0, 0.0) and counter.agreement(1) == 0.0


def test_topk_needs_a_tolerance_and_labels() -> None:
    ref = _scores(4)
    with pytest.raises(ValueError, match="needs min_agreement"):
        assert_topk(ref, ref)
    with pytest.raises(ValueError, match="needs labels"):
        assert_topk(ref, ref, max_accuracy_drop=0.0)


def test_topk_counter_merge_is_exact() -> None:
    ref, test = _scores(50), _scores(50, seed=1)
    labels = np.arange(50) % 10
    whole = topk_counter(ref, test, (1, 5), labels)
    part = TopKCounter((1, 5))
    part.update(ref[:20], test[:20], labels[:20])
    rest = TopKCounter((1, 5))
    rest.update(ref[20:], test[20:], labels[20:])
    part.merge(rest)
    assert part.to_dict() == whole.to_dict()


def test_as_scores_shapes() -> None:
    assert as_scores(np.zeros((3, 1, 10))).shape == (3, 10)
    assert as_scores(np.zeros(10)).shape == (1, 10)
    with pytest.raises(ValueError, match="class scores"):
        as_scores(np.zeros((3, 2, 10)))


def test_within_lsb_float_int_and_per_channel() -> None:
    ref = np.array([[0.0, 1.0], [2.0, 3.0]])
    assert assert_within_lsb(ref + 0.05, ref, scale=0.1) == pytest.approx(0.5)
    ints = np.array([[0, 10], [20, 31]], dtype=np.int8)
    with pytest.raises(AssertionError) as info:
        assert_within_lsb(ints, ref, scale=0.1, max_lsb=0.5)
    assert str(info.value).splitlines()[0] == "lsb 1 > 0.5 for output"
    assert " [1, 1]: 3.1 (ACTUAL), 3 (EXPECTED)" in str(info.value)
    # per-channel along axis 1: column 1 has a step of 1.0, so 0.5 off is half a step
    assert assert_within_lsb(ref + np.array([0.0, 0.5]), ref, scale=np.array([0.1, 1.0]), max_lsb=0.5) == pytest.approx(
        0.5
    )


def test_helpers_do_not_import_pytest() -> None:
    code = "import sys, pytest_qaccuracy.assertions, pytest_qaccuracy.metrics.topk; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
