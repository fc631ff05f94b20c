"""Declarative ``qaccuracy_*.toml`` suites: ids, verdicts, xfail, malformed files."""

from __future__ import annotations

import pytest

from .conftest import SUITE


def test_items_and_ids_are_deterministic(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.makeini("[pytest]\nqaccuracy_min_sqnr = 10\n")
    result = digits.runpytest("--collect-only", "-q")
    lines = [line for line in result.outlines if "::" in line]
    assert lines == [
        "qaccuracy_models.toml::qdq::min_cosine",
        "qaccuracy_models.toml::qdq::min_sqnr",
        "qaccuracy_models.toml::qdq::max_top1_drop",
        "qaccuracy_models.toml::qdq::rules",
        "qaccuracy_models.toml::broken::min_cosine",
        "qaccuracy_models.toml::broken::min_sqnr",
        "qaccuracy_models.toml::broken::max_top1_drop",
    ]


def test_suite_verdicts_and_failure_text(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE)
    result = digits.runpytest("-v")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ qaccuracy: broken::max_top1_drop _*",
            "top-1 accuracy drop 0.91* > 0.005 for output 'logits' (fp32 0.99, quantized 0.07*) (pair 'broken')",
            "Tolerance from: qaccuracy_models.toml [defaults.tolerances]",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "broken: FAILED (digits_cnn.broken.onnx vs digits_cnn.onnx *)",
            "qdq: PASSED (digits_cnn.qdq.onnx vs digits_cnn.onnx *)",  # a passing pair: its verdict line only
            "broken: FAILED on digits_test.npz",
            "  failed 2 of 2 checks (output tolerances 2), worst first:",
        ]
    )


def test_pair_layer_rule_matching_nothing_fails(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE.replace("relu* sqnr>=15", "conv* sqnr>=15"))
    result = digits.runpytest("-k", "qdq and rules")
    result.assert_outcomes(failed=1)
    # the graph input x is a compared layer too
    result.stdout.fnmatch_lines(["layer rule '*::conv* sqnr>=15' matches no compared layer (layers: x, relu1, *"])


def test_xfail_key_marks_strict_xfail(digits: pytest.Pytester) -> None:
    digits.makefile(
        ".toml",
        qaccuracy_models=SUITE.replace(
            '"models/digits_cnn.broken.onnx"', '"models/digits_cnn.broken.onnx"\nxfail = "known bad"'
        ),
    )
    result = digits.runpytest()
    result.assert_outcomes(passed=3, xfailed=2)
    bad_xfail = SUITE.replace('"models/digits_cnn.qdq.onnx"', '"models/digits_cnn.qdq.onnx"\nxfail = "wrong"')
    digits.makefile(".toml", qaccuracy_models=bad_xfail)
    digits.runpytest().assert_outcomes(failed=5)  # strict: an unexpected pass fails


PAIR_A = "[pairs.a]\nfp32 = 'models/digits_cnn.onnx'\n"
GOOD_A = PAIR_A + "quantized = 'models/digits_cnn.qdq.onnx'\ndata = 'data/digits_test.npz'\n"
MALFORMED = {
    "unknown-key": (PAIR_A + "quantised = 'x'\n", "pairs.a: unknown key 'quantised' (known: fp32, *"),
    "syntax": ("[pairs.a]\nfp32 = = 'x'\n", "not valid TOML: * (at line 2, column *)"),
    "bad-value": ("[defaults.tolerances]\nmin_cosine = 'high'\n[pairs.a]\n", "pairs.a.tolerances.min_cosine: *"),
    "missing-file": (GOOD_A.replace("qdq", "nope"), "pairs.a: qaccuracy pair: quantized not found: *nope.onnx"),
    "top-level-key": ("title = 'x'\n", "unknown key 'title' (known: defaults, pairs)"),
    "no-pairs": ("[defaults]\n", "no [[]pairs.<name>[]] table"),
    "bad-rule": (GOOD_A + "layers = ['conv1 sqnr=>3']\n", "pairs.a.layers: bad tolerance rule*"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_suite_is_a_one_line_collection_error(digits: pytest.Pytester, case: str) -> None:
    text, expected = MALFORMED[case]
    digits.makefile(".toml", qaccuracy_bad=text)
    result = digits.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ERROR collecting qaccuracy_bad.toml*", f"qaccuracy_bad.toml: {expected}"])
    assert "Traceback" not in result.stdout.str()


def test_other_toml_files_are_ignored(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", models="not = [valid")
    digits.makepyfile("def test_x(): pass")
    digits.runpytest().assert_outcomes(passed=1)


def test_marker_and_pair_id_select_items(digits: pytest.Pytester) -> None:
    """Suite items and tests using the plugin carry the ``qaccuracy`` marker, and their pair id is a
    keyword: ``-m "not qaccuracy"`` leaves only the other tests, ``-k <pair id>`` picks a pair."""
    from .conftest import PAIRS_MODULE

    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.makepyfile(test_pairs=PAIRS_MODULE, test_plain="def test_unrelated():\n    pass\n")

    def collected(*args: str) -> list[str]:
        result = digits.runpytest("--collect-only", "-q", "--strict-markers", *args)
        return [line for line in result.outlines if "::" in line]

    assert collected("-m", "not qaccuracy") == ["test_plain.py::test_unrelated"]
    assert "test_plain.py::test_unrelated" not in collected("-m", "qaccuracy")
    assert len(collected("-m", "qaccuracy")) == 7
    # the marker test's pair id is the quantized file's stem: a keyword, though not in its node id
    assert collected("-k", "digits_cnn.qdq") == ["test_pairs.py::test_good"]
    assert collected("-k", "broken and not test_broken") == [
        "qaccuracy_models.toml::broken::min_cosine",
        "qaccuracy_models.toml::broken::max_top1_drop",
    ]
