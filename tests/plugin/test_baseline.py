"""Per-layer baselines: save, compare, drift rules, missing baselines."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.report.baseline import find_drift, parse_drift_rule, profile

SUITE = """
[pairs.qdq]
fp32 = "models/digits_cnn.onnx"
quantized = "models/digits_cnn.qdq.onnx"
data = "data/digits_test.npz"
"""


def test_save_compare_and_drift(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-update-all-baselines").assert_outcomes(passed=2)
    saved = list((digits.path / "base").glob("*.json"))
    assert len(saved) == 1 and saved[0].name.startswith("qdq-")
    document = json.loads(saved[0].read_text())
    assert document["pair"] == "qdq" and "relu1" in document["layers"] and "logits" in document["outputs"]

    result = digits.runpytest("--qaccuracy-baseline=base", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*qaccuracy_models.toml::qdq::drift PASSED*"])

    # the quantized model regresses in place: same pair, new numbers
    shutil.copy(digits.path / "models/digits_cnn.broken.onnx", digits.path / "models/digits_cnn.qdq.onnx")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-min-cosine=0")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "drift: output 'logits': sqnr 30.4* -> 0.72* (limit 29.4*, sqnr:-1.0) (pair 'qdq')",
            "Tolerance from: --qaccuracy-baseline",
            "Also failed (*):",
            " drift: layer 'relu1': sqnr 41.* -> 0.98* (limit 40.*, sqnr:-1.0)",
            "*",
            "Worst records (sqnr):",  # the drift knows its output (``Drift.name``), not by its text
        ]
    )


def test_missing_baseline_and_relative_rule(digits: pytest.Pytester) -> None:
    digits.makefile(".toml", qaccuracy_models=SUITE)
    (digits.path / "empty").mkdir()
    result = digits.runpytest("--qaccuracy-baseline=empty")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["no baseline for pair 'qdq' in *empty (write one with --qaccuracy-update-baselines)*"])
    digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-update-all-baselines")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=sqnr:+1")
    result.stdout.fnmatch_lines(["drift rule 'sqnr:+1': sqnr gets worse as it falls; write sqnr:-1 *"])
    digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=mse:+20%").assert_outcomes(passed=2)


BASELINES = ".qaccuracy-baselines"


def _line(result: pytest.RunResult) -> str:
    """The one baseline line of the terminal summary."""
    lines = [line for line in result.outlines if line.startswith("baselines ")]
    assert len(lines) == 1, result.outlines
    return lines[0]


def _files(folder) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.json"))}


def test_default_folder_update_compare_and_accept(digits: pytest.Pytester) -> None:
    """The whole workflow in the default folder: passing pairs saved, compared once it exists (a pair
    without a baseline skips its drift item), unchanged files not rewritten, failing pairs written only
    with --qaccuracy-update-all-baselines."""
    from .conftest import SUITE as TWO_PAIRS  # qdq passes, broken fails max_top1_drop

    digits.makefile(".toml", qaccuracy_models=TWO_PAIRS)
    folder = digits.path / BASELINES
    result = digits.runpytest("--qaccuracy-update-baselines")
    result.assert_outcomes(passed=3, failed=2)  # no folder yet: no drift items
    assert _line(result) == (
        f"baselines {BASELINES}: saved 1, updated 0, unchanged 0, stale 0; not saved, failing: broken "
        "(--qaccuracy-update-all-baselines saves failing pairs too)"
    )
    saved = _files(folder)
    assert [name.split("-")[0] for name in saved] == ["qdq"]

    result = digits.runpytest("-v")  # the folder exists: compared automatically
    result.assert_outcomes(passed=4, failed=2, skipped=1)
    result.stdout.fnmatch_lines(["*::qdq::drift PASSED*", "*::broken::drift SKIPPED (no baseline for pair *"])
    assert _line(result) == f"baselines {BASELINES}: compared 1, missing 1 (broken), stale 0"

    stamp = (folder / next(iter(saved))).stat().st_mtime_ns
    result = digits.runpytest("--qaccuracy-update-baselines", "-k", "qdq")
    assert _line(result) == f"baselines {BASELINES}: saved 0, updated 0, unchanged 1, stale 0"
    assert (folder / next(iter(saved))).stat().st_mtime_ns == stamp  # not rewritten

    # the quantized model regresses in place: drift fails, and updating does not hide it
    shutil.copy(digits.path / "models/digits_cnn.broken.onnx", digits.path / "models/digits_cnn.qdq.onnx")
    result = digits.runpytest("-k", "qdq and drift")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "drift: output 'logits': sqnr 30.4* -> 0.72* (limit 29.4*, sqnr:-1.0) (pair 'qdq')",
            f"Tolerance from: baseline {BASELINES}/qdq-*.json",
            "quantized model changed since the baseline (sha256 * -> *)",
            "To accept these numbers as the new baseline: --qaccuracy-update-all-baselines",
        ]
    )
    assert _line(result) == f"baselines {BASELINES}: compared 1 (1 drifted: qdq), missing 0, stale 0"
    result = digits.runpytest("--qaccuracy-update-baselines")
    assert _line(result).startswith(f"baselines {BASELINES}: saved 0, updated 0, unchanged 0, stale 0; not saved")
    assert _files(folder) == saved

    result = digits.runpytest("--qaccuracy-update-all-baselines")
    assert _line(result) == f"baselines {BASELINES}: saved 1, updated 1 (qdq), unchanged 0, stale 0"
    digits.runpytest("-k", "drift").assert_outcomes(passed=2)  # the accepted numbers are the reference now


def test_ini_folder_stale_files_and_xdist(digits: pytest.Pytester) -> None:
    """``qaccuracy_baseline_dir`` is relative to the ini file; a file no pair of the session produced
    is listed as stale and kept; under xdist only the controller writes, with the same summary line."""
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.makeini("[pytest]\nqaccuracy_baseline_dir = ci/baselines\n")
    result = digits.runpytest("-n", "2", "--qaccuracy-update-baselines")
    assert _line(result) == "baselines ci/baselines: saved 1, updated 0, unchanged 0, stale 0"
    assert not (digits.path / BASELINES).exists()
    digits.makefile(".toml", qaccuracy_models=SUITE.replace("[pairs.qdq]", "[pairs.renamed]"))
    result = digits.runpytest()
    result.assert_outcomes(passed=1, skipped=1)
    old = next((digits.path / "ci/baselines").glob("qdq-*.json")).name
    prune = "; --qaccuracy-prune-baselines deletes them"
    assert _line(result) == f"baselines ci/baselines: compared 0, missing 1 (renamed), stale 1 ({old}){prune}"
    result = digits.runpytest("--qaccuracy-update-baselines")
    assert _line(result) == f"baselines ci/baselines: saved 1, updated 0, unchanged 0, stale 1 ({old}){prune}"
    assert (digits.path / "ci/baselines" / old).is_file()  # kept unless pruning is asked for
    # a session that did not run every test cannot tell a stale file from one of a deselected test
    (digits.path / "ci/baselines/notes.json").write_text('{"mine": true}')  # not a baseline: never pruned
    result = digits.runpytest("--qaccuracy-prune-baselines", "-k", "renamed")  # -k selects all: still refused
    assert _line(result) == (
        f"baselines ci/baselines: compared 1, missing 0, stale 2 (notes.json, {old}) "
        "(not pruned: tests were deselected (-k))"
    )
    result = digits.runpytest("-n", "2", "--qaccuracy-prune-baselines")
    result.assert_outcomes(passed=2)
    assert _line(result) == f"baselines ci/baselines: compared 1, missing 0, stale 1 (notes.json), pruned 1 ({old})"
    assert sorted(p.name for p in (digits.path / "ci/baselines").iterdir()) == [
        "notes.json",
        next((digits.path / "ci/baselines").glob("renamed-*.json")).name,
    ]


def test_status_line_units(tmp_path) -> None:
    from pytest_qaccuracy.report.baseline import BaselineStatus, write_baseline

    document = profile(_result(30.0, 1.0), "p")
    assert [write_baseline(tmp_path / "p.json", d) for d in (document, document)] == ["saved", "unchanged"]
    assert write_baseline(tmp_path / "p.json", profile(_result(29.0, 1.0), "p")) == "updated"
    many = tuple(f"p{i}" for i in range(12))
    status = BaselineStatus("b", False, compared=("a",), missing=many)
    assert status.line() == f"baselines b: compared 1, missing 12 ({', '.join(many[:10])}, ... (2 more)), stale 0"


def _result(sqnr: float, mse: float) -> ComparisonResult:
    return ComparisonResult(
        fp32_model="m.onnx",
        quantized_model="m.q.onnx",
        data="d.npz",
        records=4,
        metric_definitions={"sqnr": "", "mse": ""},
        outputs=[OutputResult("y", {"sqnr": sqnr, "mse": mse})],
        layers=[LayerResult("a", "a_q", "n", "Conv", 0, {"sqnr": sqnr + 10, "mse": mse / 2})],
        higher_is_better={"sqnr": True, "mse": False},
    )


def test_drift_rules_units() -> None:
    higher = {"sqnr": True, "mse": False}
    base = profile(_result(30.0, 1.0), "p")
    rules = [parse_drift_rule("sqnr:-1.0", higher), parse_drift_rule("mse:+20%", higher)]
    assert find_drift(base, _result(29.5, 1.19), rules) == ([], [])
    drifts, _ = find_drift(base, _result(28.0, 1.3), rules)
    assert [(d.target, d.metric) for d in drifts] == [
        ("output 'y'", "sqnr"),
        ("output 'y'", "mse"),
        ("layer 'a'", "sqnr"),
        ("layer 'a'", "mse"),
    ]
    assert drifts[1].allowed == pytest.approx(1.2)
    with pytest.raises(ValueError, match="unknown metric 'snr'"):
        parse_drift_rule("snr:-1", higher)
    with pytest.raises(ValueError, match="bad drift rule"):
        parse_drift_rule("sqnr -1")


def test_a_drift_rule_naming_no_metric_fails_naming_it_and_the_known_metrics(digits: pytest.Pytester) -> None:
    """``sqrn:-1`` (misspelt) is no registered metric and no pair's task value: the drift check fails
    with one line naming the rule and what it could have named, instead of skipping the rule."""
    digits.makefile(".toml", qaccuracy_models=SUITE)
    digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-update-all-baselines")
    result = digits.runpytest("--qaccuracy-baseline=base", "--qaccuracy-max-drift=sqrn:-1")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*drift rule 'sqrn:-1': unknown metric 'sqrn' (known: *cosine*sqnr*)*"])


def test_values_are_rounded_to_what_the_rules_resolve_and_sorted() -> None:
    result = ComparisonResult(
        fp32_model="m.onnx",
        quantized_model="m.q.onnx",
        data="d.npz",
        records=4,
        metric_definitions={},
        outputs=[OutputResult("z", {"sqnr": 30.471414812852693, "cosine": 0.9995513409058364, "mse": 7.3482909e-05})],
        layers=[
            LayerResult("b", "b_q", "n2", "Relu", 1, {"sqnr": float("inf"), "mse": 0.0}),
            LayerResult("a", "a_q", "n1", "Conv", 0, {"sqnr": 1234.5678, "mse": 3.0}),
        ],
        higher_is_better={"sqnr": True, "mse": False, "cosine": True},
    )
    rules = [parse_drift_rule(t) for t in ("sqnr:-1.0", "mse:+20%")]
    document = profile(result, "p", rules=rules)
    # sqnr: 1 dB / 100 -> 2 decimals; cosine, no rule: 4 significant digits; mse: 4 significant
    # digits (finer than 20 % / 100 of the value); a 4-digit SQNR keeps its 2 decimals
    assert document["outputs"] == {"z": {"cosine": 0.9996, "mse": 7.348e-05, "sqnr": 30.47}}
    assert list(document["layers"]) == ["a", "b"]  # by name, not graph order
    assert document["layers"]["a"] == {"mse": 3.0, "sqnr": 1234.57}
    assert document["layers"]["b"] == {"mse": 0.0, "sqnr": float("inf")}
    finer = profile(result, "p", rules=[parse_drift_rule("cosine:-0.001"), parse_drift_rule("mse:+0.1%")])
    assert finer["outputs"]["z"]["cosine"] == 0.99955  # 0.001 / 100: 5 decimals
    assert finer["outputs"]["z"]["mse"] == 7.34829e-05  # 0.1 % of 7.3e-05 / 100 = 7.3e-10: 10 decimals
    assert list(document["higher_is_better"]) == ["cosine", "mse", "sqnr"]


def test_improvements_beyond_the_rule_are_found_apart_from_drifts() -> None:
    from pytest_qaccuracy.report.baseline import find_improvements

    higher = {"sqnr": True, "mse": False}
    base = profile(_result(26.4, 1.0), "p")
    rules = [parse_drift_rule("sqnr:-1.0", higher), parse_drift_rule("mse:+20%", higher)]
    assert find_improvements(base, _result(27.3, 0.85), rules) == []  # better, within the rules
    better = find_improvements(base, _result(32.3, 1.0), rules)
    assert [(d.target, d.metric, d.allowed) for d in better] == [
        ("output 'y'", "sqnr", pytest.approx(27.4)),
        ("layer 'a'", "sqnr", pytest.approx(37.4)),
    ]
    assert better[0].describe() == "output 'y': sqnr 26.4 -> 32.3 (better than 27.4, sqnr:-1.0)"
    assert find_drift(base, _result(32.3, 1.0), rules) == ([], [])  # not a drift
    assert [d.metric for d in find_improvements(base, _result(26.4, 0.7), rules)] == ["mse", "mse"]


def test_a_new_version_alone_does_not_rewrite_a_baseline_and_hashes_are_recorded(tmp_path) -> None:
    from pytest_qaccuracy.report.baseline import changed_files, provenance, write_baseline

    model = tmp_path / "m.q.onnx"
    model.write_bytes(b"model")
    produced = provenance({"quantized_model": str(model), "labels": None})
    assert produced["sha256"] == {"quantized_model": hashlib.sha256(b"model").hexdigest()}
    assert {"python", "onnxruntime", "numpy", "pytest-qaccuracy"} <= set(produced["versions"])
    document = profile(_result(30.0, 1.0), "p", produced_by=produced)
    assert write_baseline(tmp_path / "p.json", document) == "saved"
    newer = json.loads(json.dumps(document))
    newer["produced_by"]["versions"]["onnxruntime"] = "99.0"
    assert write_baseline(tmp_path / "p.json", newer) == "unchanged"
    assert changed_files(document, {"quantized_model": str(model)}) == []
    model.write_bytes(b"other")
    before, after = hashlib.sha256(b"model").hexdigest(), hashlib.sha256(b"other").hexdigest()
    assert changed_files(document, {"quantized_model": str(model)}) == [
        f"quantized model changed since the baseline (sha256 {before[:12]} -> {after[:12]})"
    ]
    assert changed_files(profile(_result(30.0, 1.0), "p"), {"quantized_model": str(model)}) == []  # an old file


def test_an_improvement_is_reported_and_fails_only_when_asked(digits: pytest.Pytester) -> None:
    """A model that got better: the drift check passes and says so, the summary line counts it;
    --qaccuracy-fail-on-improvement (or the ini key) fails it."""
    digits.makefile(".toml", qaccuracy_models=SUITE)
    good = (digits.path / "models/digits_cnn.qdq.onnx").read_bytes()
    shutil.copy(digits.path / "models/digits_cnn.broken.onnx", digits.path / "models/digits_cnn.qdq.onnx")
    digits.runpytest("--qaccuracy-update-all-baselines", "--qaccuracy-min-cosine=0")
    (digits.path / "models/digits_cnn.qdq.onnx").write_bytes(good)
    result = digits.runpytest("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*::qdq::drift PASSED*"])
    assert _line(result) == f"baselines {BASELINES}: compared 1 (1 improved: qdq), missing 0, stale 0"
    summary = json.loads((digits.path / ".qaccuracy/summary.json").read_text())
    rows = [c for c in summary["pairs"][0]["checks"] if c["check"] == "drift"]
    improved = [c for c in rows if c["op"] == "improved"]
    assert improved and all(c["passed"] for c in rows)
    assert any(c["target"] == "output 'logits'" and c["value"] > c["threshold"] for c in improved)
    result = digits.runpytest("--qaccuracy-fail-on-improvement")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*improved: output 'logits': sqnr 0.72* -> 30.4* (better than 1.72*, sqnr:-1.0)*"])
    digits.makeini("[pytest]\nqaccuracy_fail_on_improvement = true\n")
    digits.runpytest().assert_outcomes(passed=1, failed=1)
