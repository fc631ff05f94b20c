"""Baselines without a pytest session (``report/baseline.py``): drift rules and their errors, the
rounding of saved values, the document, rewriting only on change, the status line, and drift and
improvement at their exact boundaries. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import errno
import hashlib
import json
import math

import pytest

from pytest_qaccuracy.analysis.results import ComparisonResult, LayerResult, OutputResult
from pytest_qaccuracy.report.baseline import (
    BaselineStatus,
    Drift,
    DriftRule,
    baseline_files,
    changed_files,
    decimals,
    find_drift,
    find_improvements,
    load_baseline,
    parse_drift_rule,
    profile,
    provenance,
    rounded,
    write_baseline,
)
from pytest_qaccuracy.report.summary import versions

HIGHER = {"sqnr": True, "mse": False}


def _result(sqnr: float | None, mse: float | None, higher: dict[str, bool] | None = None) -> ComparisonResult:
    return ComparisonResult(
        fp32_model="m.onnx",
        quantized_model="m.q.onnx",
        data="d.npz",
        records=4,
        metric_definitions={"sqnr": "", "mse": ""},
        outputs=[OutputResult("y", {"sqnr": sqnr, "mse": mse})],
        layers=[LayerResult("a", "a_q", "n", "Conv", 0, {"sqnr": sqnr, "mse": mse})],
        higher_is_better=HIGHER if higher is None else higher,
    )


# --- drift rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "baseline", "higher", "expected"),
    [
        (DriftRule("sqnr", 1.5, False, "sqnr:-1.5"), 30.0, True, 28.5),
        (DriftRule("mse", 0.5, False, "mse:+0.5"), 2.0, False, 2.5),
        (DriftRule("mse", 20.0, True, "mse:+20%"), 2.0, False, 2.4),  # 20 % of 2 = 0.4
        (DriftRule("sqnr", 10.0, True, "sqnr:-10%"), 30.0, True, 27.0),
        (DriftRule("x", 25.0, True, "x:-25%"), -8.0, True, -10.0),  # 25 % of |-8| = 2, below -8
        (DriftRule("x", 25.0, True, "x:+25%"), -8.0, False, -6.0),
    ],
)
def test_a_rule_allows_its_amount_or_percentage_in_the_worse_direction(rule, baseline, higher, expected) -> None:
    assert rule.allowed(baseline, higher) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "metric", "limit", "percent", "kept"),
    [
        ("sqnr:-1.0", "sqnr", 1.0, False, "sqnr:-1.0"),
        ("  MSE : +20%  ", "mse", 20.0, True, "MSE : +20%"),
        ("cosine:0.001", "cosine", 0.001, False, "cosine:0.001"),
        ("top_1:-5e-1", "top_1", 0.5, False, "top_1:-5e-1"),
    ],
)
def test_a_drift_rule_is_parsed_into_metric_amount_and_kind(text, metric, limit, percent, kept) -> None:
    assert parse_drift_rule(text) == DriftRule(metric, limit, percent, kept)


def test_a_rule_in_the_right_direction_or_without_a_sign_is_accepted_for_a_known_metric() -> None:
    higher = {**HIGHER, "top_1": True}
    assert parse_drift_rule("sqnr:-1", higher) == DriftRule("sqnr", 1.0, False, "sqnr:-1")
    assert parse_drift_rule("mse:+20%", higher) == DriftRule("mse", 20.0, True, "mse:+20%")
    assert parse_drift_rule("SQNR:2", higher) == DriftRule("sqnr", 2.0, False, "SQNR:2")
    assert parse_drift_rule("top_1:-0.5", higher).metric == "top_1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sqnr -1", "bad drift rule 'sqnr -1': expected '<metric>:<+|-><value>[%]', e.g. 'sqnr:-1.0'"),
        (" 1x:-1 ", "bad drift rule '1x:-1': expected '<metric>:<+|-><value>[%]', e.g. 'sqnr:-1.0'"),
        ("sqnr:-1dB", "bad drift rule 'sqnr:-1dB': expected '<metric>:<+|-><value>[%]', e.g. 'sqnr:-1.0'"),
        ("sqnr:-1.2.3", "bad drift rule 'sqnr:-1.2.3': '1.2.3' is not a number"),
        ("snr:-1", "drift rule 'snr:-1': unknown metric 'snr'"),
        ("sqnr:+1", "drift rule 'sqnr:+1': sqnr gets worse as it falls; write sqnr:-1"),
        ("mse:-20%", "drift rule 'mse:-20%': mse gets worse as it rises; write mse:+20%"),
        ("mse:-0.5", "drift rule 'mse:-0.5': mse gets worse as it rises; write mse:+0.5"),
    ],
)
def test_a_bad_drift_rule_is_one_message_naming_it(text, message) -> None:
    with pytest.raises(ValueError) as error:
        parse_drift_rule(text, HIGHER)
    assert str(error.value) == message


def test_without_the_metrics_table_any_metric_and_sign_is_taken() -> None:
    assert parse_drift_rule("snr:+1") == DriftRule("snr", 1.0, False, "snr:+1")


# --- rounding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "metric", "rules", "expected"),
    [
        (0.0, "sqnr", ["sqnr:-1"], None),
        (math.inf, "sqnr", [], None),
        (-math.inf, "sqnr", [], None),
        (math.nan, "sqnr", [], None),
        (30.47, "sqnr", [], 2),  # 4 significant digits: magnitude 1 -> 2 decimals
        (-30.47, "sqnr", [], 2),
        (7.3482909e-05, "mse", [], 8),  # magnitude -5 -> 8 decimals
        (1234.5, "sqnr", [], 0),
        (12345.6, "sqnr", [], -1),
        (1234.5678, "sqnr", ["sqnr:-1.0"], 2),  # 1 dB / 100 = 0.01
        (1234.5678, "sqnr", ["sqnr:-0.5"], 3),  # 0.005 -> 3 decimals
        (1000.0, "mse", ["mse:+1%"], 1),  # 1 % of 1000 / 100 = 0.1
        (7.3482909e-05, "mse", ["mse:+0.1%"], 10),  # 0.1 % of 7.3e-05 / 100 = 7.3e-10
        (7.3482909e-05, "mse", ["mse:+20%"], 8),  # 1.5e-07 needs 7: the 4 significant digits need more
        (1234.5, "sqnr", ["mse:+1%", "sqnr:-0.5"], 3),  # another metric's rule is skipped, not the end
        (1234.5, "sqnr", ["mse:+0.001"], 0),
        (1234.5, "sqnr", ["sqnr:-0"], None),  # a rule of 0 resolves nothing: keep the value whole
    ],
)
def test_decimals_keep_four_digits_and_what_the_rules_resolve(value, metric, rules, expected) -> None:
    assert decimals(value, metric, [parse_drift_rule(r) for r in rules]) == expected


def test_rounded_rounds_floats_only() -> None:
    rules = [parse_drift_rule("sqnr:-1")]
    assert rounded(30.471414812852693, "sqnr", rules) == 30.47
    assert rounded(30.471414812852693, "sqnr", [parse_drift_rule("sqnr:-0.01")]) == 30.4714  # 1e-4: 4 decimals
    assert rounded(30.471414812852693, "mse", [parse_drift_rule("sqnr:-0.01")]) == 30.47  # not its rule
    assert rounded(1234.5678, "sqnr") == 1235.0
    assert rounded(math.inf, "sqnr") == math.inf
    assert rounded(0.0, "sqnr") == 0.0
    for value in (None, "30.4714", True, 123456):
        assert rounded(value, "sqnr") is value


# --- the document --------------------------------------------------------------------------------


def test_the_document_holds_sorted_rounded_tables_task_values_and_where_they_came_from() -> None:
    result = ComparisonResult(
        fp32_model="m.onnx",
        quantized_model="m.q.onnx",
        data="d.npz",
        records=4,
        metric_definitions={},
        outputs=[OutputResult("z", {"sqnr": 30.4714, "mse": 0.123456}), OutputResult("b", {"sqnr": 10.0})],
        layers=[
            LayerResult("t2", "t2_q", "n2", "Relu", 1, {"sqnr": 41.23456}),
            LayerResult("t1", "t1_q", "n1", "Conv", 0, {"sqnr": 9.87654}),
        ],
        higher_is_better={"sqnr": True, "mse": False},
    )
    task = {
        "top1": {"quantized": 0.912345678, "higher_is_better": True, "fp32": 0.95},
        "loss": {"quantized": 1.23456789, "higher_is_better": False},
    }
    # sqnr:-0.01 resolves 1e-4 (4 decimals, finer than 4 significant digits); top1:-0.0001 resolves 1e-6
    rules = [parse_drift_rule("sqnr:-0.01"), parse_drift_rule("top1:-0.0001")]
    document = profile(result, "p", task=task, rules=rules, produced_by={"sha256": {}})
    assert document == {
        "schema_version": 1,
        "pair": "p",
        "fp32_model": "m.onnx",
        "quantized_model": "m.q.onnx",
        "data": "d.npz",
        "records": 4,
        "higher_is_better": {"loss": False, "mse": False, "sqnr": True, "top1": True},
        "outputs": {"b": {"sqnr": 10.0}, "z": {"mse": 0.1235, "sqnr": 30.4714}},
        "layers": {"t1": {"sqnr": 9.8765}, "t2": {"sqnr": 41.2346}},
        "task": {"loss": 1.235, "top1": 0.912346},
        "produced_by": {"sha256": {}},
    }
    assert list(document["layers"]) == ["t1", "t2"]  # by name, not graph order
    assert list(document["outputs"]) == ["b", "z"] and list(document["outputs"]["z"]) == ["mse", "sqnr"]
    assert list(document["higher_is_better"]) == ["loss", "mse", "sqnr", "top1"]
    assert list(document["task"]) == ["loss", "top1"]
    bare = profile(result, "p", task={})
    assert "task" not in bare and "produced_by" not in bare
    assert bare["higher_is_better"] == {"mse": False, "sqnr": True}
    assert bare["outputs"]["z"] == {"mse": 0.1235, "sqnr": 30.47}  # no rule: 4 significant digits


def test_provenance_hashes_the_named_files_and_records_the_versions(tmp_path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"weights")
    produced = provenance({"fp32_model": str(model), "labels": None, "data": ""})
    assert produced == {"sha256": {"fp32_model": hashlib.sha256(b"weights").hexdigest()}, "versions": versions()}


def test_changed_files_names_each_file_whose_hash_moved(tmp_path) -> None:
    fp32, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    fp32.write_bytes(b"one")
    data.write_bytes(b"two")
    files = {"fp32_model": str(fp32), "data": str(data), "labels": None}
    document = {"produced_by": provenance(files)}
    assert changed_files(document, files) == []
    fp32.write_bytes(b"three")
    data.unlink()
    one, three = hashlib.sha256(b"one").hexdigest(), hashlib.sha256(b"three").hexdigest()
    two = hashlib.sha256(b"two").hexdigest()
    assert changed_files(document, files) == [
        f"fp32 model changed since the baseline (sha256 {one[:12]} -> {three[:12]})",
        f"data changed since the baseline (sha256 {two[:12]} -> None)",
    ]
    # a file the baseline has no hash of, an unnamed file, an old baseline: nothing to say
    assert changed_files({"produced_by": {"sha256": {"data": None}}}, files) == []
    assert changed_files(document, {"fp32_model": None, "quantized_model": str(fp32)}) == []
    assert changed_files({"produced_by": None}, files) == []
    assert changed_files({"produced_by": {"sha256": None}}, files) == []
    assert changed_files({}, files) == []
    # a skipped file does not end the walk
    assert changed_files(document, {"labels": None, "quantized_model": str(fp32), "fp32_model": str(fp32)}) == [
        f"fp32 model changed since the baseline (sha256 {one[:12]} -> {three[:12]})"
    ]


def test_a_baseline_is_rewritten_only_when_its_numbers_or_hashes_change(tmp_path) -> None:
    path = tmp_path / "p.json"
    document = {"pair": "p", "value": 1.5, "worst": math.nan, "produced_by": {"sha256": {"a": "1"}, "versions": {}}}
    assert write_baseline(path, document) == "saved"
    assert json.loads(path.read_text()) == {**document, "worst": None}  # strict JSON: NaN as null
    written = path.read_bytes()
    newer = {**document, "produced_by": {"sha256": {"a": "1"}, "versions": {"numpy": "9"}}}
    assert write_baseline(path, newer) == "unchanged" and path.read_bytes() == written
    assert write_baseline(path, {**document, "produced_by": {"sha256": {"a": "2"}}}) == "updated"
    assert json.loads(path.read_text())["produced_by"] == {"sha256": {"a": "2"}}
    assert write_baseline(path, {**document, "value": 1.25}) == "updated"
    assert json.loads(path.read_text())["value"] == 1.25


def test_a_file_in_another_shape_or_not_json_is_replaced(tmp_path) -> None:
    path = tmp_path / "p.json"
    document = {"pair": "p", "produced_by": "by hand"}
    path.write_text("{not json")
    assert write_baseline(path, document) == "updated"
    assert json.loads(path.read_text()) == document
    assert write_baseline(path, document) == "unchanged"  # a produced_by that is not a table compares whole
    path.write_text("[1, 2]")
    assert write_baseline(path, document) == "updated"
    path.write_text(json.dumps({"pair": "p"}))
    assert write_baseline(path, {"pair": "p"}) == "unchanged"


def test_baseline_files_are_the_json_files_directly_in_the_folder(tmp_path) -> None:
    assert baseline_files(tmp_path / "none") == []
    for name in ("b.json", "a.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.json").write_text("{}")
    assert baseline_files(tmp_path) == ["a.json", "b.json"]
    assert baseline_files(tmp_path / "a.json") == []


def test_load_baseline_reads_a_good_file_and_skips_a_folder(tmp_path) -> None:
    assert load_baseline(tmp_path) is None
    good = {"schema_version": 1, "outputs": {"y": {"sqnr": 3, "mse": None}}}
    (tmp_path / "b.json").write_text(json.dumps(good))
    assert load_baseline(tmp_path / "b.json") == good
    bad = {**good, "outputs": {"y": {"sqnr": "3"}}}
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError) as error:
        load_baseline(tmp_path / "b.json")
    assert str(error.value) == f"{tmp_path / 'b.json'}: outputs.'y'.sqnr: '3' is not a number"
    (tmp_path / "b.json").write_text(json.dumps({**good, "outputs": []}))
    with pytest.raises(ValueError) as error:
        load_baseline(tmp_path / "b.json")
    assert str(error.value) == f"{tmp_path / 'b.json'}: outputs: expected a table of output -> metrics"
    (tmp_path / "b.json").write_text(json.dumps({**good, "higher_is_better": [True]}))
    with pytest.raises(ValueError, match="higher_is_better: expected a table of true/false by metric"):
        load_baseline(tmp_path / "b.json")


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OSError(errno.EIO, "Input/output error"), "Input/output error"), (OSError("no reason"), "no reason")],
)
def test_a_baseline_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, error, reason) -> None:
    """Root reads any file, so the read error is raised by hand."""
    file = tmp_path / "b.json"
    file.write_text("{}")

    def fail(*args: object, **kwargs: object) -> str:
        raise error

    monkeypatch.setattr(type(file), "read_text", fail)
    with pytest.raises(ValueError) as info:
        load_baseline(file)
    assert str(info.value) == f"{file}: cannot read ({reason})"


# --- the status line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (
            BaselineStatus("b", True, saved=("p1", "p2"), updated=("p3",)),
            "baselines b: saved 2, updated 1 (p3), unchanged 0, stale 0",
        ),
        (
            BaselineStatus("b", True, unchanged=("p1",), failing=("p4", "p5")),
            "baselines b: saved 0, updated 0, unchanged 1, stale 0; not saved, failing: p4, p5 "
            "(--qaccuracy-update-all-baselines saves failing pairs too)",
        ),
        (
            BaselineStatus("b", False, compared=("a", "b", "c"), drifted=("a",), improved=("b", "c")),
            "baselines b: compared 3 (1 drifted: a; 2 improved: b, c), missing 0, stale 0",
        ),
        (
            BaselineStatus("b", False, compared=("a",), improved=("a",), missing=("m",)),
            "baselines b: compared 1 (1 improved: a), missing 1 (m), stale 0",
        ),
        (
            BaselineStatus("b", False, compared=("a",), unreadable=("u",)),
            "baselines b: compared 1, not compared (unreadable) 1 (u), missing 0, stale 0",
        ),
        (
            BaselineStatus("b", False, stale=("old.json",)),
            "baselines b: compared 0, missing 0, stale 1 (old.json); --qaccuracy-prune-baselines deletes them",
        ),
        (
            BaselineStatus("b", False, stale=("old.json",), prune_refused="a pair failed"),
            "baselines b: compared 0, missing 0, stale 1 (old.json) (not pruned: a pair failed)",
        ),
        (
            BaselineStatus("b", False, prune_refused="a pair failed"),
            "baselines b: compared 0, missing 0, stale 0",
        ),
        (
            BaselineStatus("b", True, pruned=("old.json",)),
            "baselines b: saved 0, updated 0, unchanged 0, pruned 1 (old.json)",
        ),
        (
            BaselineStatus("b", True, stale=("x.json",), pruned=("old.json",)),
            "baselines b: saved 0, updated 0, unchanged 0, stale 1 (x.json), pruned 1 (old.json)",
        ),
    ],
)
def test_the_status_line(status: BaselineStatus, line: str) -> None:
    assert status.line() == line


@pytest.mark.parametrize(("count", "tail"), [(10, ""), (11, ", ... (1 more)"), (12, ", ... (2 more)")])
def test_a_long_list_of_names_shows_ten_and_how_many_more(count: int, tail: str) -> None:
    names = tuple(f"p{i}" for i in range(count))
    line = BaselineStatus("b", False, missing=names).line()
    assert line == f"baselines b: compared 0, missing {count} ({', '.join(names[:10])}{tail}), stale 0"


# --- drift ---------------------------------------------------------------------------------------


def test_a_drift_and_an_improvement_describe_themselves() -> None:
    drift = Drift("output 'y'", "sqnr", 30.0, 28.25, 29.0, "sqnr:-1")
    assert drift.describe() == "output 'y': sqnr 30 -> 28.25 (limit 29, sqnr:-1)"
    none = Drift("layer 'a'", "mse", 1.0, None, 1.2, "mse:+20%")
    assert none.describe() == "layer 'a': mse 1 -> undefined (limit 1.2, mse:+20%)"
    better = Drift("output 'y'", "sqnr", 30.0, 32.5, 31.0, "sqnr:-1", improved=True)
    assert better.describe() == "output 'y': sqnr 30 -> 32.5 (better than 31, sqnr:-1)"


RULES = [parse_drift_rule("sqnr:-1", HIGHER), parse_drift_rule("mse:+25%", HIGHER)]


@pytest.mark.parametrize(
    ("sqnr", "mse", "drifted", "improved"),
    [
        (29.0, 1.25, [], []),  # exactly at both limits: accepted (30 - 1, 1 + 25 %)
        (31.0, 0.75, [], []),  # exactly at the mirrored limits: not an improvement
        (28.75, 1.25, ["sqnr"], []),
        (29.0, 1.375, ["mse"], []),
        (31.5, 1.0, [], ["sqnr"]),
        (30.0, 0.5, [], ["mse"]),
        (None, None, ["sqnr", "mse"], []),  # a metric no longer defined has drifted
    ],
)
def test_drift_and_improvement_at_their_boundaries(sqnr, mse, drifted, improved) -> None:
    base = profile(_result(30.0, 1.0), "p")
    drifts, missing = find_drift(base, _result(sqnr, mse), RULES)
    assert missing == []
    assert [(d.target, d.metric) for d in drifts] == [(t, m) for t in ("output 'y'", "layer 'a'") for m in drifted]
    assert not any(d.improved for d in drifts)
    better = find_improvements(base, _result(sqnr, mse), RULES)
    assert [(d.target, d.metric) for d in better] == [(t, m) for t in ("output 'y'", "layer 'a'") for m in improved]
    assert all(d.improved for d in better)


def test_a_drift_carries_its_values_the_limit_and_the_rule() -> None:
    base = profile(_result(30.0, 1.0), "p")
    drifts, _ = find_drift(base, _result(28.5, 1.5), RULES)
    assert drifts[:2] == [
        Drift("output 'y'", "sqnr", 30.0, 28.5, 29.0, "sqnr:-1", scope="output", name="y"),
        Drift("output 'y'", "mse", 1.0, 1.5, 1.25, "mse:+25%", scope="output", name="y"),
    ]
    better = find_improvements(base, _result(32.0, 0.5), RULES)
    assert better[:2] == [
        Drift("output 'y'", "sqnr", 30.0, 32.0, 31.0, "sqnr:-1", improved=True, scope="output", name="y"),
        Drift("output 'y'", "mse", 1.0, 0.5, 0.75, "mse:+25%", improved=True, scope="output", name="y"),
    ]


def test_targets_gone_are_missing_and_metrics_on_one_side_only_are_skipped() -> None:
    base = profile(_result(30.0, 1.0), "p")
    base["outputs"]["gone"] = {"sqnr": 1.0}
    base["layers"]["a"] = {"sqnr": 30.0}  # no saved mse: the mse rule skips the layer
    result = _result(10.0, 9.0)
    result.outputs[0].metrics.pop("mse")  # no current mse: the rule skips the output
    drifts, missing = find_drift(base, result, RULES)
    assert missing == ["output 'gone'"]
    assert [(d.target, d.metric) for d in drifts] == [("output 'y'", "sqnr"), ("layer 'a'", "sqnr")]
    base["layers"]["a"] = {"sqnr": None}  # a value that was undefined then: nothing to compare
    assert [d.target for d in find_drift(base, result, RULES)[0]] == ["output 'y'"]
    # a rule skipped on a target does not end that target's rules
    drifts, _ = find_drift(base, result, RULES[::-1])
    assert [(d.target, d.metric) for d in drifts] == [("output 'y'", "sqnr")]


def test_a_baseline_without_outputs_or_layers_compares_what_it_has() -> None:
    base = profile(_result(30.0, 1.0), "p")
    only_layers = {k: v for k, v in base.items() if k != "outputs"}
    assert [(d.target, d.metric) for d in find_drift(only_layers, _result(28.0, 1.0), RULES)[0]] == [
        ("layer 'a'", "sqnr")
    ]
    only_outputs = {k: v for k, v in base.items() if k != "layers"}
    assert [(d.target, d.metric) for d in find_drift(only_outputs, _result(28.0, 1.0), RULES)[0]] == [
        ("output 'y'", "sqnr")
    ]


def test_the_direction_comes_from_the_result_then_the_baseline_then_lower_is_better() -> None:
    rule = [parse_drift_rule("sqnr:1")]  # no sign: the direction is the metric's
    base = profile(_result(30.0, 1.0), "p")
    # the result does not say: the baseline's sqnr is higher-is-better, so 31 is an improvement
    assert [d.improved for d in find_drift(base, _result(31.5, 1.0, higher={}), rule)[0]] == []
    assert [d.metric for d in find_improvements(base, _result(31.5, 1.0, higher={}), rule)] == ["sqnr", "sqnr"]
    # the result overrides the baseline: sqnr now lower-is-better, 31.5 is beyond 30 + 1
    assert len(find_drift(base, _result(31.5, 1.0, higher={"sqnr": False}), rule)[0]) == 2
    # neither says: lower is better
    del base["higher_is_better"]
    assert len(find_drift(base, _result(31.5, 1.0, higher={}), rule)[0]) == 2
    assert find_drift(base, _result(29.5, 1.0, higher={}), rule) == ([], [])


def test_task_values_drift_with_their_own_direction_and_go_missing() -> None:
    task = {"top1": {"quantized": 0.9, "higher_is_better": True}, "loss": {"quantized": 2.0}}
    base = profile(_result(30.0, 1.0), "p", task=task)
    rules = [parse_drift_rule("top1:-0.01"), parse_drift_rule("loss:+0.5")]
    now = {"top1": {"quantized": 0.875, "higher_is_better": True}, "loss": {"quantized": 2.5}}
    drifts, missing = find_drift(base, _result(30.0, 1.0), rules, task=now)
    assert missing == []
    assert drifts == [
        Drift("task 'top1'", "top1", 0.9, 0.875, pytest.approx(0.89), "top1:-0.01", scope="task", name="top1")
    ]
    better = find_improvements(base, _result(30.0, 1.0), rules, task={**now, "top1": {**now["top1"], "quantized": 1.0}})
    assert [(d.target, d.current) for d in better] == [("task 'top1'", 1.0)]
    assert find_drift(base, _result(30.0, 1.0), rules, task={"top1": now["top1"]})[1] == ["task 'loss'"]
    assert find_drift(base, _result(30.0, 1.0), rules)[1] == ["task 'loss'", "task 'top1'"]
