"""Unit tests of the report writers, tables and summaries (the ``writers`` mutation group).

Every expected value is worked out by hand from the layouts in docs/report.md, docs/sensitivity.md
and docs/recipe.md; none is copied from the code's own output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_qaccuracy.analysis.cumulative import CumulativeCurve, CumulativeResult
from pytest_qaccuracy.analysis.recipe.checks import Check
from pytest_qaccuracy.analysis.recipe.search import RecipeResult, Step
from pytest_qaccuracy.analysis.recipe.space import Recipe
from pytest_qaccuracy.analysis.sensitivity import NodeSensitivity, SensitivityResult
from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport
from pytest_qaccuracy.analysis.sweep import SweepResult, SweepStep, Target
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.report import (
    artifacts,
    completeness,
    environment,
    html,
    html_data,
    publish,
    recipe_tables,
    terminal,
)
from pytest_qaccuracy.report import sensitivity_summary as summary
from pytest_qaccuracy.report import sensitivity_tables as tables
from tests.ort_features import needs_cache

# --- terminal -------------------------------------------------------------------------------------


def test_control_characters_are_escaped_at_the_edges_of_each_range() -> None:
    escaped = {
        "\x00": "\\x00",
        "\x09": "\\t",
        "\x0b": "\\x0b",
        "\x1f": "\\x1f",
        "\x7f": "\\x7f",
        "\x80": "\\x80",
        "\x9f": "\\x9f",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
        "\u202a": "\\u202a",
        "\u202e": "\\u202e",
        "\u2066": "\\u2066",
        "\u2069": "\\u2069",
    }
    for raw, shown in escaped.items():
        assert terminal.escape_control(f"a{raw}b") == f"a{shown}b"
    kept = "\n \x20~\xa0\u2027\u202f\u2065\u206aé"
    assert terminal.escape_control(kept) == kept
    assert terminal.escape_control("\x1b[2J\x1b[2J") == "\\x1b[2J\\x1b[2J"


def test_match_warning_only_below_half() -> None:
    assert terminal.match_warning(0, 5) is None  # no layers compared (--outputs-only)
    assert terminal.match_warning(1, 1) is None  # exactly half
    assert terminal.match_warning(3, 0) is None
    assert terminal.match_warning(1, 2) == "warning: only 1 of 3 layers matched: are these the same model?"
    assert terminal.match_warning(2, 3) == "warning: only 2 of 5 layers matched: are these the same model?"


# --- completeness ---------------------------------------------------------------------------------


def test_a_complete_session_has_no_missing_entry_and_no_headline() -> None:
    status = completeness.SessionStatus()
    assert status.complete and status.status == "complete"
    assert status.to_dict() is None and status.headline() is None


def test_an_incomplete_session_lists_everything_it_lacks() -> None:
    status = completeness.SessionStatus("interrupted", "Ctrl-C", ("a", "b"), (("t1", "p1"),), 2)
    assert not status.complete
    assert status.to_dict() == {
        "reason": "Ctrl-C",
        "not_run": ["a", "b"],
        "lost": [{"test": "t1", "pair": "p1"}],
        "workers_lost": 2,
    }
    assert status.headline() == (
        "session interrupted (Ctrl-C); 2 test(s) did not run: a, b; "
        "1 check(s) ran but their results were lost: t1 (pair 'p1'); "
        "2 xdist worker(s) sent no results (crashed?). These artifacts do not cover the whole session."
    )
    bare = completeness.SessionStatus("incomplete")
    assert bare.headline() == "session incomplete. These artifacts do not cover the whole session."
    assert bare.to_dict() == {"reason": None, "not_run": [], "lost": [], "workers_lost": 0}


def test_headline_names_five_tests_then_counts_the_rest() -> None:
    five = completeness.SessionStatus("incomplete", "-x", tuple("abcde"))
    assert five.headline().startswith("session incomplete (-x); 5 test(s) did not run: a, b, c, d, e. ")
    seven = completeness.SessionStatus("incomplete", None, tuple("abcdefg"))
    assert "7 test(s) did not run: a, b, c, d, e and 2 more. " in seven.headline()


# --- artifacts ------------------------------------------------------------------------------------


def test_file_names_of_a_comparison() -> None:
    assert artifacts.comparison_name("s") == "s.comparison.json"
    assert artifacts.visq_name("s", "mse") == "s.mse.visq.json"
    assert artifacts.dot_name("s", "mse") == "s.mse.dot"
    assert artifacts.artifact_names("s", ["mse", "sqnr"]) == [
        "s.comparison.json",
        "s.mse.visq.json",
        "s.mse.dot",
        "s.sqnr.visq.json",
        "s.sqnr.dot",
        "report.html",
    ]


def test_session_stem_strips_dots_and_underscores_at_both_ends_and_keeps_60_characters() -> None:
    import hashlib

    hash8 = hashlib.sha256(b"k").hexdigest()[:8]
    assert artifacts.artifact_stem("._a b_.", "k") == f"a_b-{hash8}"
    assert artifacts.artifact_stem("A-z.0_9", "k") == f"A-z.0_9-{hash8}"
    assert artifacts.artifact_stem("y" * 61, "k") == "y" * 60 + f"-{hash8}"
    assert artifacts.artifact_stem("a\u00e9\u00e9b", "k") == f"a_b-{hash8}"  # one run of unsafe characters


def test_paths_skip_the_metrics_without_a_dot() -> None:
    files = artifacts.ComparisonFiles(
        Path("c.json"), {"mse": Path("m.visq"), "sqnr": Path("s.visq")}, {"sqnr": Path("s.dot")}
    )
    assert files.paths() == [Path("c.json"), Path("m.visq"), Path("s.visq"), Path("s.dot")]


def test_refused_targets_are_named_by_their_option(tmp_path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(InputError, match="--json"):
        artifacts.check_artifact_targets(tmp_path / "dir", None, "s", ["mse"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="--out-dir"):
        artifacts.check_artifact_targets(None, tmp_path / "file", "s", ["mse"])
    artifacts.check_artifact_targets(tmp_path / "ok.json", tmp_path / "out", "s", ["mse"])  # both fine
    artifacts.check_artifact_targets(None, None, "s", ["mse"])


def test_json_carries_the_checks_and_their_verdict(tmp_path, small_result, small_model) -> None:
    checks = [{"passed": True, "name": "a"}, {"passed": False, "name": "b"}]
    written = artifacts.write_comparison_artifacts(
        small_result, small_model, json_path=tmp_path / "c.json", checks=checks
    )
    assert written == [tmp_path / "c.json"]
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["passed"] is False and data["checks"] == checks
    assert data["quantized_model"] == "models/net.int8.onnx"
    artifacts.write_comparison_artifacts(small_result, small_model, json_path=tmp_path / "d.json", checks=checks[:1])
    assert json.loads((tmp_path / "d.json").read_text())["passed"] is True
    artifacts.write_comparison_artifacts(small_result, small_model, json_path=tmp_path / "e.json")
    plain = json.loads((tmp_path / "e.json").read_text())
    assert "passed" not in plain and "checks" not in plain
    assert sorted(os.listdir(tmp_path)) == ["c.json", "d.json", "e.json"]  # no temp file left


def test_out_dir_and_json_together(tmp_path, small_result, small_model) -> None:
    written = artifacts.write_comparison_artifacts(
        small_result, small_model, json_path=tmp_path / "c.json", out_dir=tmp_path / "out"
    )
    assert written[-1] == tmp_path / "c.json" and written[-2] == tmp_path / "out" / "report.html"
    assert [p.parent for p in written[:-1]] == [tmp_path / "out"] * (len(written) - 1)
    assert all(p.is_file() for p in written)


def test_a_failed_write_names_the_option_and_changes_nothing(tmp_path, small_result, small_model) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="--json"):
        artifacts.write_comparison_artifacts(small_result, small_model, json_path=blocker / "c.json")
    with pytest.raises(InputError, match="--out-dir"):
        artifacts.write_comparison_artifacts(small_result, small_model, out_dir=blocker / "out")
    assert sorted(os.listdir(tmp_path)) == ["file"] and blocker.read_text() == "x"


# --- publish --------------------------------------------------------------------------------------


def test_stage_is_a_hidden_random_sibling(tmp_path) -> None:
    a, b = publish.stage_name(tmp_path / "out"), publish.stage_name(tmp_path / "out")
    assert a.parent == tmp_path and a != b
    assert a.name.startswith(".out.") and a.name.endswith(".tmp") and len(a.name) == len(".out.") + 16 + 4


def test_foreign_entries_split_files_from_the_rest(tmp_path) -> None:
    assert publish.foreign_entries(tmp_path / "missing", ()) == ([], [])
    (tmp_path / "f").write_text("x")
    (tmp_path / "b").write_text("x")
    (tmp_path / "own").write_text("x")
    (tmp_path / ".x.abc.tmp").write_text("x")
    (tmp_path / ".keep").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "f")
    files, others = publish.foreign_entries(tmp_path, {"own"})
    assert files == [tmp_path / ".keep", tmp_path / "b", tmp_path / "f"]
    assert others == [tmp_path / "link", tmp_path / "sub"]


def test_check_publishable_refusals(tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(InputError, match=f"--o {out}: holds {out}; artifacts need a folder of their own"):
        publish.check_publishable(out, "--o", (), protected=(out,))
    with pytest.raises(InputError, match=r"holds .*out/x; artifacts need"):
        publish.check_publishable(out, "--o", (), protected=(out / "x",))
    publish.check_publishable(out / "a", "--o", (), protected=(out / "ab",))  # a sibling is no parent
    out.mkdir()
    for name in ("d1", "d2", "d3", "d4"):
        (out / name).mkdir()
    (out / "link").symlink_to(out / "d1")
    with pytest.raises(InputError) as info:
        publish.check_publishable(out, "--o", ())
    assert str(info.value).startswith(f"--o {out}: holds d1/, d2/, d3/, not written by pytest-qaccuracy; ")
    publish.check_publishable(out, "--o", {"d1", "d2", "d3", "d4", "link"})


def test_out_dir_is_never_the_current_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="--out-dir"):
        publish.check_out_dir(tmp_path, "--out-dir")
    with pytest.raises(InputError, match="--out-dir"):
        publish.check_out_dir(tmp_path.parent, "--out-dir")
    publish.check_out_dir(tmp_path / "sub", "--out-dir")
    assert not (tmp_path / "sub").exists()


def test_publish_carries_foreign_files_over_and_replaces_owned_ones(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes").write_text("mine")
    (out / "a.json").write_text("old")
    (out / "stale.json").write_text("old")

    def build(stage):
        (stage / "a.json").write_text("new")
        return [stage / "a.json", tmp_path / "elsewhere"]

    written = publish.publish_files(out, build, {"a.json", "stale.json"})
    assert written == [out / "a.json", tmp_path / "elsewhere"]
    assert sorted(os.listdir(out)) == ["a.json", "notes"]
    assert (out / "a.json").read_text() == "new" and (out / "notes").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no stage left, no old folder left


def test_publish_into_a_new_folder_creates_its_parents(tmp_path) -> None:
    out = tmp_path / "p" / "out"
    result = publish.publish_folder(out, lambda stage: (stage / "x").write_text("1"), {"x"})
    assert result == 1 and (out / "x").read_text() == "1"
    assert os.listdir(tmp_path / "p") == ["out"]


def test_a_failed_build_leaves_the_folder_as_it_was(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.json").write_text("old")

    def build(stage):
        (stage / "a.json").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish.publish_folder(out, build, {"a.json"})
    assert os.listdir(tmp_path) == ["out"] and (out / "a.json").read_text() == "old"


def test_a_sub_folder_made_while_building_is_refused(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()

    def build(stage):
        (out / "late").mkdir()
        (stage / "a").write_text("1")

    with pytest.raises(InputError, match=r"artifacts folder .*holds late/"):
        publish.publish_folder(out, build, {"a"})
    assert os.listdir(out) == ["late"] and os.listdir(tmp_path) == ["out"]


def test_swap_without_exchange_uses_two_renames(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("old")
    publish.publish_folder(out, lambda stage: (stage / "a").write_text("new"), {"a"})
    assert (out / "a").read_text() == "new" and os.listdir(tmp_path) == ["out"]


def test_exchange_swaps_two_folders(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "in_a").write_text("")
    assert publish._exchange(a, b) is True
    assert os.listdir(b) == ["in_a"] and os.listdir(a) == []
    with pytest.raises(OSError) as info:
        publish._exchange(a, tmp_path / "missing")
    assert info.value.filename == str(tmp_path / "missing")


# --- html_data ------------------------------------------------------------------------------------


def test_linear_ticks_are_round_steps() -> None:
    assert html_data.ticks(0, 10) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]  # span 10: step 2 (10 / 1 > 6 ticks)
    assert html_data.ticks(0, 6) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # 6 / 1 <= 6: step 1
    assert html_data.ticks(0, 4) == [0.0, 1.0, 2.0, 3.0, 4.0]  # base step 0.1, 4 / 1.0 <= 6
    assert html_data.ticks(9.5, 20.5) == [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
    assert html_data.ticks(0, 25) == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]  # base 1: 25, 12.5, 10 > 6; 5
    assert html_data.ticks(0, 12.5) == pytest.approx([0.0, 2.5, 5.0, 7.5, 10.0, 12.5])  # base 1: 2.5
    assert html_data.ticks(0, 55) == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]  # base 10: 5.5 <= 6 at once
    assert html_data.ticks(-0.3, 0.7) == pytest.approx([-0.2, 0.0, 0.2, 0.4, 0.6])
    assert html_data.ticks(-0.3, 0.7)[1] == 0.0
    assert html_data.ticks(-0.4, 0.4) == pytest.approx([-0.4, -0.2, 0.0, 0.2, 0.4])  # 0.8 / 0.2 = 4


def test_zero_tick_is_exact_zero() -> None:
    found = html_data.ticks(-0.30000000000000004, 0.3)
    assert 0.0 in found and found.count(0.0) == 1
    for t in html_data.ticks(-0.7, 0.7):
        assert t == 0.0 or abs(t) > 1e-9


def test_log_ticks_are_whole_powers_of_ten() -> None:
    assert html_data.ticks(-0.5, 2.2, log=True) == [0.0, 1.0, 2.0]
    assert html_data.ticks(-0.5, 1.5, log=True) == [0.0, 1.0]  # two are enough
    assert html_data.ticks(0.1, 0.9, log=True) == [0.1, 0.9]  # none inside: the ends
    assert html_data.ticks(0.5, 1.5, log=True) == [0.5, 1.5]  # one inside: the ends
    assert html_data.ticks(1.0000000001, 2.9999999999, log=True) == [1.0, 2.0, 3.0]  # within 1e-9


def test_axis_of_an_error_metric_starts_at_zero() -> None:
    axis = html_data.axis("mse", [2.0, 4.0, float("nan"), float("inf")], higher_better=False)
    assert axis["lo"] == 0.0 and axis["hi"] == 4.0 and axis["log"] is False
    assert [t for t, _ in axis["ticks"]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [label for _, label in axis["ticks"]] == ["0", "1", "2", "3", "4"]


def test_axis_of_a_better_when_higher_metric_gets_a_margin() -> None:
    axis = html_data.axis("sqnr", [10.0, 20.0], higher_better=True)
    assert axis["lo"] == pytest.approx(9.5) and axis["hi"] == pytest.approx(20.5)
    assert axis["ticks"][0] == [10.0, "10.00 dB"] and axis["ticks"][-1] == [20.0, "20.00 dB"]
    negative = html_data.axis("x", [-4.0, -2.0], higher_better=False)
    assert negative["lo"] == -4.0 and negative["hi"] == -2.0  # no margin for an error metric


def test_axis_of_one_value_is_padded_by_half_of_it() -> None:
    assert html_data.axis("sqnr", [5.0], True) | {"ticks": None} == {"lo": 2.5, "hi": 7.5, "log": False, "ticks": None}
    assert html_data.axis("sqnr", [-4.0], True)["lo"] == -6.0
    zero = html_data.axis("sqnr", [0.0], True)
    assert (zero["lo"], zero["hi"]) == (-1.0, 1.0)
    assert html_data.axis("mse", [0.0, 0.0], False)["hi"] == 1.0


def test_log_axis() -> None:
    axis = html_data.axis("mse", [0.01, 100.0], False, log=True)
    assert axis["lo"] == pytest.approx(-2.2) and axis["hi"] == pytest.approx(2.2) and axis["log"] is True
    assert [t for t, _ in axis["ticks"]] == [-2.0, -1.0, 0.0, 1.0, 2.0]
    assert [label for _, label in axis["ticks"]] == ["0.01", "0.1", "1", "10", "100"]
    assert html_data.axis("mse", [0.0, 1.0], False, log=True) is None
    assert html_data.axis("mse", [-1.0, 1.0], False, log=True) is None
    assert html_data.axis("mse", [], False) is None
    assert html_data.axis("mse", [float("nan")], False) is None


def test_scales_in_words() -> None:
    assert html_data._scale("cosine", True) == "min..max of the values (dark red = lowest)"
    assert html_data._scale("mse", False) == "min..max of the values"
    assert html_data._scale("srmse", False) == "0..max of the values"
    assert html_data._scale("srmse", True) == "0..max of the values (dark red = lowest)"
    assert html_data._scale("sqnr", True) == "min..max of the values (dark red = lowest)"
    assert html_data._scale("mpeir", False) == "fixed 0..1"


# --- sensitivity_summary: the dict-only parts -------------------------------------------------------


def test_task_suggestion_met_missed_and_failed() -> None:
    steps = [{"drop": 0.02, "excluded": []}, {"drop": 0.01, "excluded": ["a"]}, {"drop": 0.004, "excluded": ["a", "b"]}]
    task = {"check": "max_drop:cer", "threshold": 0.005, "records": 8, "steps": steps, "suggestion": ["a", "b"]}
    assert summary.task_suggestion(task) == (
        "target max_drop:cer <= 0.005 (task metric, 8 records, 0.02 -> 0.004): nodes_to_exclude=['a', 'b']"
    )
    low = {"check": "min:accuracy", "threshold": 0.9, "records": 4, "suggestion": None}
    low["steps"] = [{"quantized": 0.5, "excluded": []}, {"quantized": None, "excluded": ["a", "b", "c"]}]
    assert summary.task_suggestion(low) == (
        "target min:accuracy >= 0.9 (task metric, 4 records, 0.5 -> undefined): not met with up to 3 nodes in float"
    )
    assert summary.task_suggestion({**low, "steps": []}) == (
        "target min:accuracy >= 0.9 (task metric, 4 records, ): not met with up to 0 nodes in float"
    )
    assert summary.task_suggestion({**low, "error": "boom"}) == "target min:accuracy >= 0.9: not analysed: boom"
    assert summary.task_suggestion({"check": "max:wer", "threshold": 1e-7, "records": 1, "steps": None}) == (
        "target max:wer <= 1e-07 (task metric, 1 records, ): not met with up to 0 nodes in float"
    )
    assert summary.task_suggestion(None) is None and summary.task_suggestion({}) is None


def test_recipe_arguments_name_the_ranges_file_when_written() -> None:
    args = {"per_channel": True, "calibration_cache_path": None}
    entry = {"recipe": {"quantize_static": args}, "recipe_files": {"ranges": "pairs/s.ranges.json"}}
    assert summary.recipe_arguments(entry) == {"per_channel": True, "calibration_cache_path": "pairs/s.ranges.json"}
    assert summary.recipe_arguments({"recipe": {"quantize_static": args}}) == args
    plain = {"recipe": {"quantize_static": {"per_channel": False}}, "recipe_files": {"ranges": "r"}}
    assert summary.recipe_arguments(plain) == {"per_channel": False}
    assert summary.recipe_arguments({"recipe": {"quantize_static": None}}) is None
    assert summary.recipe_arguments({"recipe": None}) is None and summary.recipe_arguments({}) is None
    copied = summary.recipe_arguments({"recipe": {"quantize_static": args}})
    assert copied is not args


def test_recipe_files_in_the_pairs_folder() -> None:
    recipe = {"best": 0, "quantize_static": {"calibration_cache_path": None}, "ranges": {"x": [0.0, 1.0]}}
    record = {"stem": "s", "sensitivity": {"recipe": recipe}}
    assert summary.recipe_files_in(record) == {
        "json": "pairs/s.recipe.json",
        "python": "pairs/s.recipe.py",
        "ranges": "pairs/s.ranges.json",
        "steps": "pairs/s.recipe.steps.txt",
    }
    assert summary.recipe_files_in(record, "out")["json"] == "out/pairs/s.recipe.json"
    no_ranges = {"stem": "s", "sensitivity": {"recipe": {**recipe, "ranges": None}}}
    assert sorted(summary.recipe_files_in(no_ranges)) == ["json", "python", "steps"]
    no_args = {"stem": "s", "sensitivity": {"recipe": {"best": 2, "quantize_static": {}}}}
    assert summary.recipe_files_in(no_args) == {"json": "pairs/s.recipe.json", "steps": "pairs/s.recipe.steps.txt"}
    assert summary.recipe_files_in({"stem": "s", "sensitivity": {"recipe": {**recipe, "best": None}}}) == {}
    assert summary.recipe_files_in({"stem": "s", "sensitivity": None}) == {}
    assert summary.recipe_files_in({"stem": "s"}) == {}


def test_with_recipe_files_adds_them_to_a_copy() -> None:
    record = {"id": "p", "sensitivity": {"mode": "single"}}
    assert summary.with_recipe_files(record, None) is record and summary.with_recipe_files(record, {}) is record
    files = {"json": "pairs/s.recipe.json"}
    added = summary.with_recipe_files(record, files)
    assert added == {"id": "p", "sensitivity": {"mode": "single", "recipe_files": files}}
    assert record == {"id": "p", "sensitivity": {"mode": "single"}}


def _recipe_data(best: int | None = 1) -> dict:
    step = {"cost": 2.0, "measured": {"calib": {"out": {"cosine": 0.99}}}}
    return {
        "best": best,
        "met": best is not None,
        "stopped": "met",
        "checks": ["cosine >= 0.98"],
        "targets": ["calib"],
        "records": 8,
        "steps": [{"cost": 1.0, "measured": {}}, step],
        "seconds": 3.5,
        "quantize_static": {"per_channel": True},
    }


def test_recipe_brief_in_summary_json() -> None:
    assert summary.recipe_brief({"recipe_note": "not searched: no target"}) == {
        "searched": False,
        "note": "not searched: no target",
    }
    assert summary.recipe_brief({}) is None and summary.recipe_brief({"recipe": None}) is None
    data = _recipe_data()
    brief = summary.recipe_brief({"recipe": data, "recipe_files": {"json": "pairs/s.recipe.json"}})
    assert brief == {
        "searched": True,
        "met": True,
        "stopped": "met",
        "checks": ["cosine >= 0.98"],
        "not_aimed": [],
        "targets": ["calib"],
        "evaluation_records": 8,
        "quantize_static": {"per_channel": True},
        "convert_opset": None,
        "cost": 2.0,
        "measured": {"calib": {"out": {"cosine": 0.99}}},
        "pair_data": None,
        "experiments": 2,
        "seconds": 3.5,
        "budget": None,
        "calibration_records": None,
        "files": {"json": "pairs/s.recipe.json"},
    }
    extra = {"not_aimed": ("x",), "convert_opset": 13, "pair_data": {"records": 9}, "budget": 60}
    full = summary.recipe_brief({"recipe": {**data, **extra, "calibration_records": 4}})
    assert full["not_aimed"] == ["x"] and full["convert_opset"] == 13 and full["pair_data"] == {"records": 9}
    assert full["budget"] == 60 and full["calibration_records"] == 4 and full["files"] is None
    none = summary.recipe_brief({"recipe": _recipe_data(None)})
    assert none["cost"] is None and none["measured"] is None and none["met"] is False


def test_unanalysed_pair_lines_brief_and_view() -> None:
    record = {"checks": [], "sensitivity": {"mode": "single", "metric": "sqnr", "error": "boom"}}
    assert summary.sensitivity_lines(record) == ["  sensitivity not analysed: boom"]
    assert summary.sensitivity_view(record) == {"note": "sensitivity not analysed: boom"}
    noted = {"sensitivity": {**record["sensitivity"], "recipe_note": "not searched: x"}}
    assert summary.sensitivity_lines(noted) == ["  sensitivity not analysed: boom", "  not searched: x"]
    assert summary.sensitivity_view(noted) == {"note": "sensitivity not analysed: boom", "recipe": ["not searched: x"]}
    for empty in ({}, {"sensitivity": None}, {"sensitivity": {}}):
        assert summary.sensitivity_lines(empty) == [] and summary.sensitivity_view(empty) is None
        assert summary.sensitivity_brief(empty) is None
    entry = {**record["sensitivity"], "seconds": 1.5, "budget": 10.0, "target_from": {"check": "c"}}
    assert summary.sensitivity_brief({"sensitivity": entry}) == {
        "mode": "single",
        "metric": "sqnr",
        "target_from": {"check": "c"},
        "target": None,
        "nodes_to_exclude": None,
        "most_sensitive": [],
        "unsupported": None,
        "stopped": None,
        "error": "boom",
        "recipe": None,
        "seconds": 1.5,
        "budget": 10.0,
    }
    task = {"check": "max:wer", "threshold": 0.1, "records": 1}
    assert summary.sensitivity_brief({"sensitivity": {**entry, "task": task}})["task"] == task


# --- sensitivity results built by hand --------------------------------------------------------------


#: the models, data and record count every analysis result below names
RUN = {"fp32_model": "f.onnx", "quantized_model": "q.onnx", "data": "d.h5", "records": 4}


def _sensitivity(measured_at=(), unmeasured=()) -> SensitivityResult:
    nodes = [
        NodeSensitivity("conv_a", "Conv", 0, {"sqnr": 30.0, "mse": 0.001}),
        NodeSensitivity("gemm_b", "Gemm", 1, {"sqnr": 12.5, "mse": 0.04}),
        NodeSensitivity("relu_c", "Relu", 2, {"sqnr": None, "mse": 0.5}),
        NodeSensitivity("add_d", "Add", 3, {"sqnr": 20.0, "mse": None}),
    ]
    return SensitivityResult(
        **RUN,
        mode="single",
        granularity="node",
        metric_definitions={"sqnr": "s", "mse": "m"},
        higher_is_better={"sqnr": True, "mse": False},
        baseline={"sqnr": 10.0, "mse": None},
        nodes=nodes,
        measured_at=list(measured_at),
        unmeasured=list(unmeasured),
    )


SQNR_15 = Target("sqnr", 15.0)


def _sweep(suggestion=("gemm_b",), target=SQNR_15) -> SweepResult:
    steps = [SweepStep(0, [], {"sqnr": 10.0}), SweepStep(1, ["gemm_b"], {"sqnr": 16.0})]
    return SweepResult(
        **RUN,
        ranking_mode="single",
        ranking_metric="sqnr",
        target=target,
        suggestion=None if suggestion is None else list(suggestion),
        steps=steps,
    )


def _cumulative(average=False) -> CumulativeResult:
    return CumulativeResult(
        **RUN,
        metric="sqnr",
        formula="f",
        higher_is_better=True,
        average_mode=average,
        nodes=["conv_a", "gemm_b"],
        op_types=["Conv", "Gemm"],
        curves=[CumulativeCurve("all", None, [], "node", [30.0, None])],
    )


def _rows(text: str) -> list[list[str]]:
    """The body of a tabulate ``simple`` table: its lines after the dashes, split on spaces."""
    lines = text.splitlines()
    dashes = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "} and "-" in line)
    return [line.split() for line in lines[dashes + 1 :]]


def test_sensitivity_title() -> None:
    assert tables.sensitivity_title(_sensitivity()) == (
        "single sensitivity (node) of q.onnx on d.h5 (4 records), ranked by sqnr"
    )
    assert tables.sensitivity_title(_sensitivity(["t1", "t2"])) == (
        "single sensitivity (node) of q.onnx measured at t1, t2 on d.h5 (4 records), ranked by sqnr"
    )


def test_sensitivity_table_ranks_worst_first_and_cuts_at_top() -> None:
    text = tables.sensitivity_table(_sensitivity())
    lines = text.splitlines()
    assert lines[0].startswith("single sensitivity (node)")
    assert lines[1].split() == ["rank", "node", "op_type", "sqnr", "mse"]
    # sqnr is better when higher: the lowest first, the undefined last
    body = _rows(text)
    assert body[:4] == [
        ["1", "gemm_b", "Gemm", "12.5", "0.04"],
        ["2", "add_d", "Add", "20", "n/a"],
        ["3", "conv_a", "Conv", "30", "0.001"],
        ["4", "relu_c", "Relu", "n/a", "0.5"],
    ]
    assert lines[-1] == "fully quantized model: sqnr 10, mse n/a"
    top = tables.sensitivity_table(_sensitivity(), top=2).splitlines()
    assert top[-2] == "... 2 more node(s)" and top[-1] == "fully quantized model: sqnr 10, mse n/a"
    assert len(top) == 1 + 2 + 2 + 2
    exact = tables.sensitivity_table(_sensitivity(), top=4).splitlines()
    assert not any(line.startswith("...") for line in exact) and len(exact) == 1 + 2 + 4 + 1


def test_sweep_table() -> None:
    text = tables.sweep_table(_sweep())
    lines = text.splitlines()
    assert lines[0] == "partial quantization sweep (single ranking by sqnr)"
    assert lines[1].split() == ["k", "kept", "in", "float", "sqnr"]
    assert _rows(text)[:2] == [["0", "(none)", "10"], ["1", "gemm_b", "16"]]
    assert lines[-1] == "target sqnr >= 15: nodes_to_exclude=['gemm_b']"
    untargeted = tables.sweep_table(_sweep(target=None)).splitlines()
    assert len(untargeted) == 5 and untargeted[-1].split() == ["1", "gemm_b", "16"]
    empty = dataclasses.replace(_sweep(None, None), steps=[])
    assert tables.sweep_table(empty).splitlines()[1].split() == ["k", "kept", "in", "float"]


def test_cumulative_table() -> None:
    text = tables.cumulative_table(_cumulative())
    assert text.splitlines()[0] == "cumulative sqnr of q.onnx"
    assert text.splitlines()[1].split() == ["order", "node", "op_type", "all"]
    assert _rows(text) == [["0", "conv_a", "Conv", "30"], ["1", "gemm_b", "Gemm", "n/a"]]
    assert tables.cumulative_table(_cumulative(True)).splitlines()[0] == "cumulative sqnr (average mode) of q.onnx"


def test_sensitivity_artifacts_files_and_json(tmp_path) -> None:
    sens, sweep, cum = _sensitivity(), _sweep(), _cumulative()
    written = tables.write_sensitivity_artifacts(
        "s", tmp_path / "out", tmp_path / "all.json", sensitivity=sens, sweep=sweep, cumulative=cum
    )
    out = tmp_path / "out"
    names = ["s.sensitivity.json", "s.sweep.json", "s.cumulative.json", "s.cumulative.chart.json"]
    assert written == [*(out / n for n in names), tmp_path / "all.json"]
    assert sorted(os.listdir(out)) == sorted(names)
    assert json.loads((out / "s.sweep.json").read_text()) == sweep.to_dict()
    chart = json.loads((out / "s.cumulative.chart.json").read_text())
    assert chart["x"] == ["conv_a", "gemm_b"] and chart["series"] == [{"name": "all", "y": [30.0, None]}]
    document = json.loads((tmp_path / "all.json").read_text())
    assert list(document) == ["schema_version", "sensitivity", "sweep", "cumulative"]
    assert document["schema_version"] == 1 and document["sensitivity"] == sens.to_dict()
    only = tables.write_sensitivity_artifacts("t", json_path=tmp_path / "one.json", sweep=sweep)
    assert only == [tmp_path / "one.json"]
    assert list(json.loads(only[0].read_text())) == ["schema_version", "sweep"]
    assert tables.write_sensitivity_artifacts("u") == []


def test_sensitivity_artifacts_failures_name_the_option(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="--out-dir"):
        tables.write_sensitivity_artifacts("s", out_dir=blocker / "out", sweep=_sweep())
    with pytest.raises(InputError, match="--json"):
        tables.write_sensitivity_artifacts("s", json_path=blocker / "a.json", sweep=_sweep())
    assert os.listdir(tmp_path) == ["file"]


def test_report_lines_and_files(tmp_path) -> None:
    report = SensitivityReport("s", _sensitivity(), _sweep(), None)
    lines = tables.report_lines(report, top=1)
    assert lines[0].startswith("single sensitivity") and "... 3 more node(s)" in lines
    assert lines[-1] == "target sqnr >= 15: nodes_to_exclude=['gemm_b']"
    assert tables.report_lines(SensitivityReport("s", unsupported="QOperator model")) == [
        "sensitivity of s: QOperator model"
    ]
    assert tables.report_lines(SensitivityReport("s", None, _sweep(target=None))) == []
    assert tables.report_lines(SensitivityReport("s", None, _sweep())) == [
        "target sqnr >= 15: nodes_to_exclude=['gemm_b']"
    ]
    written = tables.write_report(report, tmp_path / "o")
    assert [p.name for p in written] == ["s.sensitivity.json", "s.sweep.json"]
    assert [p.name for p in tables.write_report(report, tmp_path / "p", "x")] == ["x.sensitivity.json", "x.sweep.json"]


def _record(report: SensitivityReport, passed=(True,), **entry) -> dict:
    return {
        "checks": [{"passed": p} for p in passed],
        "sensitivity": {"mode": "single", "metric": "sqnr", "report": report.to_dict(), **entry},
    }


def test_sensitivity_lines_of_an_analysed_pair() -> None:
    report = SensitivityReport("s", _sensitivity(), _sweep())
    target = {"check": "sqnr >= 15", "target": "out"}
    lines = summary.sensitivity_lines(_record(report, (False,), target_from=target), top=2)
    assert all(line.startswith("  ") for line in lines)
    assert lines[0] == "  single sensitivity (node) of q.onnx on d.h5 (4 records), ranked by sqnr"
    assert lines[-2] == "  fully quantized model: sqnr 10, mse n/a"
    assert lines[-1] == "  target sqnr >= 15 (failed sqnr >= 15 on out): nodes_to_exclude=['gemm_b']"
    plain = summary.sensitivity_lines(_record(report))
    assert plain[-1] == "  target sqnr >= 15: nodes_to_exclude=['gemm_b']"


def test_sensitivity_lines_say_why_no_list_was_suggested() -> None:
    report = SensitivityReport("s", _sensitivity(), None)
    failed = summary.sensitivity_lines(_record(report, (True, False)))
    assert failed[-1] == "  no exclusion list suggested: no failed cosine or SQNR check on an output to aim at"
    passed = summary.sensitivity_lines(_record(report, (True, True)))
    assert passed[-1] == "  fully quantized model: sqnr 10, mse n/a"
    untargeted = summary.sensitivity_lines(_record(SensitivityReport("s", _sensitivity(), _sweep(target=None))))
    assert untargeted[-1] == "  fully quantized model: sqnr 10, mse n/a"


def test_a_stopped_ranking_says_so_under_its_title() -> None:
    report = SensitivityReport("s", _sensitivity(), None, stopped="ranking stopped at the budget after 4 of 6 nodes")
    lines = summary.sensitivity_lines(_record(report))
    assert lines[1] == "  ranking stopped at the budget after 4 of 6 nodes"
    assert lines[2].split() == ["rank", "node", "op_type", "sqnr", "mse"]


def test_unsupported_and_unranked_reports() -> None:
    unsupported = SensitivityReport("s", unsupported="QOperator model")
    assert summary.sensitivity_lines(_record(unsupported)) == ["  sensitivity of s: QOperator model"]
    assert summary.sensitivity_view(_record(unsupported)) == {"note": "sensitivity of s: QOperator model"}
    bare = SensitivityReport("s")
    assert summary.sensitivity_lines(_record(bare)) == ["  sensitivity not analysed"]
    brief = summary.sensitivity_brief(_record(unsupported))
    assert brief["unsupported"] == "QOperator model" and brief["most_sensitive"] == [] and brief["target"] is None


def test_sensitivity_brief_of_an_analysed_pair() -> None:
    report = SensitivityReport("s", _sensitivity(), _sweep(), stopped="cut")
    brief = summary.sensitivity_brief(_record(report), top=3)
    assert brief["most_sensitive"] == ["gemm_b", "add_d", "conv_a"]
    assert brief["target"] == "sqnr >= 15" and brief["nodes_to_exclude"] == ["gemm_b"]
    assert brief["stopped"] == "cut" and brief["unsupported"] is None and brief["error"] is None
    assert "task" not in brief
    untargeted = summary.sensitivity_brief(_record(SensitivityReport("s", _sensitivity(), _sweep(target=None))))
    assert untargeted["target"] is None and untargeted["nodes_to_exclude"] is None
    assert len(untargeted["most_sensitive"]) == 4


def test_sensitivity_view_of_an_analysed_pair() -> None:
    report = SensitivityReport("s", _sensitivity(), _sweep(), _cumulative(), stopped="cut")
    task = {"check": "max:wer", "threshold": 0.5, "records": 2, "steps": [], "suggestion": None}
    view = summary.sensitivity_view(_record(report, task=task), top=2)
    assert view == {
        "title": "single sensitivity (node) of q.onnx on d.h5 (4 records), ranked by sqnr",
        "metric": "sqnr",
        "rows": [
            {"rank": 1, "node": "gemm_b", "op_type": "Gemm", "value": 12.5},
            {"rank": 2, "node": "add_d", "op_type": "Add", "value": 20.0},
        ],
        "more": 2,
        "baseline": 10.0,
        "stopped": "cut",
        "suggestion": "target sqnr >= 15: nodes_to_exclude=['gemm_b']; "
        "target max:wer <= 0.5 (task metric, 2 records, ): not met with up to 0 nodes in float",
        "chart": _cumulative().chart_data(),
        "recipe": [],
    }
    whole = summary.sensitivity_view(_record(SensitivityReport("s", _sensitivity())))
    assert len(whole["rows"]) == 4 and whole["more"] == 0
    assert whole["suggestion"] is None and whole["chart"] is None and whole["stopped"] is None


# --- recipe tables, on steps built by hand ------------------------------------------------------------

COSINE = Check("cosine", 0.98, True)
SCORES = Check("sqnr", 20.0, True, output="scores")


def _step(index, measured, passed=False, cost=1.0, recipe=None, **kwargs) -> Step:
    return Step(
        index=index,
        phase=kwargs.pop("phase", "start"),
        change=kwargs.pop("change", "minmax per-tensor"),
        recipe=recipe or Recipe(),
        cost=cost,
        measured=measured,
        passed=passed,
        margin=kwargs.pop("margin", -0.03),
        seconds=kwargs.pop("seconds", 1.5),
        **kwargs,
    )


FIRST = {"cpu": {"out": {"cosine": 0.95, "sqnr": 15.0}, "scores": {"cosine": 0.97, "sqnr": 18.0}}}
SECOND = {"cpu": {"out": {"cosine": 0.99, "sqnr": 25.0}, "scores": {"cosine": 0.999, "sqnr": 30.0}}}


def _recipe_result(steps, best, checks=(COSINE,), targets=("cpu",), **kwargs) -> RecipeResult:
    return RecipeResult(
        "f.onnx", "cal.h5", "eval.h5", 8, list(checks), list(targets), {}, steps, best, "met", 3.0, **kwargs
    )


def _columns(table: str) -> list[list[str]]:
    """The cells of a tabulate ``simple`` table, cut at its dash line's gaps (cells may hold spaces)."""
    lines = table.splitlines()
    spans, start = [], None
    for i, c in enumerate(lines[1] + " "):
        if c == "-" and start is None:
            start = i
        elif c != "-" and start is not None:
            spans.append((start, i))
            start = None
    cut = [[line[a:b].strip() for a, b in spans[:-1]] + [line[spans[-1][0] :].strip()] for line in lines]
    return [cut[0], *cut[2:]]


def test_metric_text_takes_the_worst_output_in_the_checks_direction() -> None:
    assert recipe_tables._metric_text(_step(0, FIRST), COSINE) == {"cpu": "0.9500"}  # min of 0.95, 0.97
    assert recipe_tables._metric_text(_step(0, FIRST), SCORES) == {"cpu": "18.00 dB"}  # its one output
    mse = Check("mse", 0.1, False)
    assert recipe_tables._metric_text({"a": {"o1": {"mse": 0.5}, "o2": {"mse": 0.25}}}, mse) == {"a": "0.5"}
    assert recipe_tables._metric_text({"a": {"o1": {"mse": 0.5}, "o2": {"mse": None}}}, mse) == {"a": "n/a"}
    assert recipe_tables._metric_text({"a": {"o1": {"cosine": 0.5}}, "b": {}}, mse) == {"a": "n/a", "b": "n/a"}


def test_labels_name_the_one_output() -> None:
    assert recipe_tables._label(COSINE) == "cosine" and recipe_tables._label(SCORES) == "sqnr 'scores'"


def test_step_lines() -> None:
    first = _step(0, FIRST)
    assert recipe_tables.step_line(first, None, [COSINE, SCORES]) == (
        "recipe: step 0 [start] minmax per-tensor: cost 1, cosine 0.9500 (cpu); "
        "sqnr 'scores' 18.00 dB (cpu): fails, 1.5s"
    )
    second = _step(1, SECOND, True, 2.5, phase="float", change="x" * 61, estimated=True, seconds=0.04)
    assert recipe_tables.step_line(second, first, [COSINE]) == (
        f"recipe: step 1 [float] {'x' * 57}...: cost 2.5, estimate, cosine 0.9900 (cpu): meets the target, "
        "0.0s (best: step 0)"
    )
    skipped = _step(2, {}, skipped="onnxruntime refused it", change="x" * 60, cost=12345.678)
    assert recipe_tables.step_line(skipped, None, [COSINE]) == (
        f"recipe: step 2 [start] {'x' * 60}: cost 1.235e+04, skipped: onnxruntime refused it, 1.5s"
    )


def test_steps_table() -> None:
    steps = [
        _step(0, FIRST),
        _step(1, SECOND, True, 2.5),
        _step(2, SECOND, True, 3.0, estimated=True),
        _step(3, {}, skipped="refused"),
        _step(4, FIRST, estimated=True),
    ]
    result = _recipe_result(steps, 1, (COSINE, SCORES), ("cpu", "npu"))
    cells = _columns(recipe_tables.steps_table(result))
    checks = ["cosine cpu", "cosine npu", "sqnr 'scores' cpu", "sqnr 'scores' npu"]
    assert cells[0] == ["step", "phase", "change", "cost", *checks, "verdict"]
    assert cells[1] == ["0", "start", "minmax per-tensor", "1", "0.9500", "", "18.00 dB", "", "fail"]
    assert cells[2] == ["1", "start", "minmax per-tensor", "2.5", "0.9900", "", "30.00 dB", "", "pass best"]
    assert cells[3][-1] == "estimate: pass" and cells[4][-1] == "skipped: refused" and cells[5][-1] == "estimate: fail"
    assert cells[4][4:8] == ["", "", "", ""]


def test_verdict_lines_of_a_met_recipe() -> None:
    recipe = Recipe(
        float=frozenset({"b", "a"}),
        int16=frozenset({"c"}),
        flipped=frozenset({"d", "a"}),
        narrowed=frozenset({"e"}),
        retyped=frozenset({"f"}),
    )
    result = _recipe_result([_step(0, FIRST), _step(1, SECOND, True, 2.5, recipe=recipe)], 1, convert_opset=13)
    assert recipe_tables.verdict_lines(result) == [
        "recipe meets cosine >= 0.98 on eval.h5 (8 held-out records): cosine 0.9900 on cpu; cost 2.5 (step 1)",
        "  method=minmax per_channel=False reduce_range=False activation_type=uint8 weight_type=int8",
        "  convert_opset=13: the fp32 model is converted to opset 13 (onnx.version_converter) before "
        "quantize_static, for per-channel weights",
        "  nodes_to_exclude=['a', 'b']",
        "  16-bit activations: ['c']",
        "  per-channel weights (TensorQuantOverrides): ['d']",
        "  7-bit weights (TensorQuantOverrides): ['e']",
        "  uint8 weights (TensorQuantOverrides): ['f']",
    ]
    other = Recipe(
        per_channel=True,
        reduce_range=True,
        weight_type="uint8",
        flipped=frozenset({"d"}),
        narrowed=frozenset({"e"}),
        retyped=frozenset({"f"}),
    )
    lines = recipe_tables.verdict_lines(_recipe_result([_step(0, SECOND, True, recipe=other)], 0))
    assert lines[1:] == [
        "  method=minmax per_channel=True reduce_range=True activation_type=uint8 weight_type=uint8",
        "  per-tensor weights (TensorQuantOverrides): ['d']",
        "  8-bit weights (TensorQuantOverrides): ['e']",
        "  int8 weights (TensorQuantOverrides): ['f']",
    ]


def test_verdict_lines_of_a_missed_or_empty_search() -> None:
    missed = _recipe_result([_step(0, FIRST)], 0, (COSINE, SCORES), held_out=False)
    assert recipe_tables.verdict_lines(missed)[0] == (
        "no recipe met cosine >= 0.98 and sqnr >= 20 on 'scores' within the search (met); best found (step 0) "
        "on eval.h5 (8 records, the calibration records: not held out): cosine 0.9500 on cpu; "
        "sqnr 'scores' 18.00 dB on cpu; margin -0.03; cost 1"
    )
    noted = _recipe_result([_step(0, FIRST)], 0, note="budget spent")
    assert "within the search (budget spent)" in recipe_tables.verdict_lines(noted)[0]
    assert recipe_tables.verdict_lines(_recipe_result([], None)) == ["no recipe measured (met)"]
    assert recipe_tables.verdict_lines(_recipe_result([], None, note="refused")) == ["no recipe measured (refused)"]


def test_pair_data_line() -> None:
    data = {"records": 20, "measured": {"cpu": {"out": {"cosine": 0.99}}}, "met": True}
    assert recipe_tables.pair_data_line(data, [COSINE]) == (
        "  on all 20 records of the pair's data (what its check reads): cosine 0.9900 on cpu: meets"
    )
    assert recipe_tables.pair_data_line({**data, "met": False}, [COSINE]).endswith(
        ": cosine 0.9900 on cpu: MISSES: the pair stays red with this recipe on its own records"
    )
    assert recipe_tables.pair_data_line({"records": 3, "note": "too slow"}, [COSINE]) == "  too slow"
    assert recipe_tables.pair_data_line({"records": 3}, [COSINE]) == "  not measured on all the pair's records"


def test_recipe_file_names() -> None:
    assert recipe_tables.recipe_file_names("s", None, True) == {"json": "s.recipe.json", "steps": "s.recipe.steps.txt"}
    with_cache = {"calibration_cache_path": None}
    assert recipe_tables.recipe_file_names("s", with_cache, True) == {
        "json": "s.recipe.json",
        "python": "s.recipe.py",
        "ranges": "s.ranges.json",
        "steps": "s.recipe.steps.txt",
    }
    assert "ranges" not in recipe_tables.recipe_file_names("s", with_cache, False)
    assert "ranges" not in recipe_tables.recipe_file_names("s", {"per_channel": True}, True)


def _written_result(tmp_path, **kwargs) -> RecipeResult:
    model = tmp_path / "best.onnx"
    model.write_bytes(b"model bytes")
    return _recipe_result([_step(0, SECOND, True)], 0, arguments={"per_channel": False}, model=str(model), **kwargs)


def test_write_recipe_files(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = _written_result(tmp_path)
    written = recipe_tables.write_recipe(result, "out", "models/net.onnx", "cal.h5", records=4)
    out = tmp_path / "out"
    names = ["net.recipe.onnx", "net.recipe.json", "net.recipe.py", "net.recipe.steps.txt"]
    assert written == [Path("out") / name for name in names]  # under the folder as given
    assert sorted(os.listdir(out)) == sorted(p.name for p in written)  # no partial file left
    assert (out / "net.recipe.onnx").read_bytes() == b"model bytes"
    document = json.loads((out / "net.recipe.json").read_text())
    assert document["model_input"] == str(tmp_path / "models" / "net.onnx")
    assert document["model_output"] == str(out / "net.recipe.onnx")
    assert document["quantize_static"] == {"per_channel": False} and document["calibration_records"] == 4
    assert document["met"] is True and document["best"] == 0
    script = (out / "net.recipe.py").read_text()
    assert str(tmp_path / "models" / "net.onnx") in script and str(tmp_path / "cal.h5") in script
    steps = (out / "net.recipe.steps.txt").read_text()
    assert steps.endswith("pass best\n") and steps.splitlines()[0].split()[:4] == ["step", "phase", "change", "cost"]


@needs_cache
def test_write_recipe_staged_names_files_beside_the_script(tmp_path) -> None:
    result = _written_result(tmp_path, ranges={"x": (0.0, 1.0)})
    result.arguments["calibration_cache_path"] = None
    written = recipe_tables.write_recipe(result, tmp_path / "o", "m/net.onnx", "c.h5", stem="s", staged=True)
    names = ["s.ranges.json", "s.recipe.onnx", "s.recipe.json", "s.recipe.py", "s.recipe.steps.txt"]
    assert [p.name for p in written] == names
    document = json.loads((tmp_path / "o" / "s.recipe.json").read_text())
    assert document["model_input"] == "m/net.onnx" and document["model_output"] == "s.recipe.onnx"
    assert document["quantize_static"]["calibration_cache_path"] == "s.ranges.json"
    assert "calibration_records" not in document
    assert result.arguments["calibration_cache_path"] is None  # the result itself is left as it was


def test_write_recipe_without_a_model_file(tmp_path) -> None:
    result = _recipe_result([_step(0, SECOND, True)], 0, model=str(tmp_path / "gone.onnx"))
    written = recipe_tables.write_recipe(result, tmp_path, "net.onnx", "c.h5")
    assert [p.name for p in written] == ["net.recipe.json", "net.recipe.steps.txt"]
    in_place = _recipe_result([_step(0, SECOND, True)], 0, model=str(tmp_path / "n.recipe.onnx"))
    (tmp_path / "n.recipe.onnx").write_bytes(b"already here")
    written = recipe_tables.write_recipe(in_place, tmp_path, "n.onnx", "c.h5")
    assert written[0] == tmp_path / "n.recipe.onnx" and written[0].read_bytes() == b"already here"


def test_a_failed_model_copy_leaves_no_partial_file(tmp_path, monkeypatch) -> None:
    result = _written_result(tmp_path)

    def half_copy(source, target):
        target.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recipe_tables.shutil, "copyfileobj", half_copy)
    with pytest.raises(OSError):
        recipe_tables.write_recipe(result, tmp_path / "out", "net.onnx", "c.h5")
    assert os.listdir(tmp_path / "out") == []


# --- recipe lines in the session summary ----------------------------------------------------------


def test_recipe_lines() -> None:
    result = _recipe_result([_step(0, FIRST), _step(1, SECOND, True, 2.5)], 1, arguments={"per_channel": False})
    data = {**result.to_dict(), "pair_data": {"records": 20, "measured": SECOND, "met": True}, "not_aimed": ["x"]}
    lines = summary.recipe_lines({"recipe": data})
    assert lines[0].startswith("recipe meets cosine >= 0.98")
    assert lines[1].startswith("  on all 20 records of the pair's data")
    assert lines[2].startswith("  method=minmax")
    assert lines[3:] == ["  not aimed at: x", '  quantize_static arguments: {"per_channel": false}']
    cached = {**data, "quantize_static": {"per_channel": False, "calibration_cache_path": None}, "pair_data": None}
    assert summary.recipe_lines({"recipe": cached})[-2:] == [
        '  quantize_static arguments: {"calibration_cache_path": null, "per_channel": false}',
        "  its calibration ranges (calibration_cache_path) are written with the session's artifacts only",
    ]
    files = {"json": "pairs/s.recipe.json", "steps": "pairs/s.recipe.steps.txt"}
    assert summary.recipe_lines({"recipe": cached, "recipe_files": files})[-1] == (
        "  recipe files in the artifacts folder: pairs/s.recipe.json, pairs/s.recipe.steps.txt"
    )
    bare = {**data, "quantize_static": None, "pair_data": None, "not_aimed": None}
    assert summary.recipe_lines({"recipe": bare})[-1].startswith("  method=minmax")
    unmeasured = {**_recipe_result([], None).to_dict(), "pair_data": {"records": 1, "note": "n"}}
    assert summary.recipe_lines({"recipe": unmeasured}) == ["no recipe measured (met)"]
    assert summary.recipe_lines({"recipe_note": "not searched", "recipe": data}) == ["not searched"]
    assert summary.recipe_lines({}) == []


# --- environment ----------------------------------------------------------------------------------


def test_commit_from_the_first_ci_variable(monkeypatch, tmp_path) -> None:
    for name in environment.COMMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GITHUB_SHA", "  ")  # blank: skipped
    monkeypatch.setenv("GIT_COMMIT", " abc123 \n")
    monkeypatch.setenv("BUILDKITE_COMMIT", "later")
    assert environment.commit(tmp_path) == "abc123"
    monkeypatch.setenv("CI_COMMIT_SHA", "first")
    assert environment.commit(tmp_path) == "first"


def test_commit_from_git_or_none(monkeypatch, tmp_path) -> None:
    for name in environment.COMMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert environment.commit(tmp_path) is None  # not a repository
    calls = []

    def run(args, **kwargs):
        calls.append((args, kwargs))
        return subprocess.CompletedProcess(args, 0, stdout="  d00d\n", stderr="")

    monkeypatch.setattr(environment.subprocess, "run", run)
    assert environment.commit(tmp_path) == "d00d"
    assert calls[0][0] == ["git", "rev-parse", "HEAD"] and calls[0][1]["cwd"] == tmp_path
    assert calls[0][1]["capture_output"] is True and calls[0][1]["text"] is True
    monkeypatch.chdir(tmp_path)
    environment.commit()
    assert calls[1][1]["cwd"] == tmp_path
    monkeypatch.setattr(environment.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "\n", ""))
    assert environment.commit(tmp_path) is None

    def missing(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(environment.subprocess, "run", missing)
    assert environment.commit(tmp_path) is None


def test_cpu_name_and_cores(monkeypatch, tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2GHz \nmodel name\t: other\n")
    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path, *a, **k)
    )
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 4)
    assert environment.cpu_name() == "Some CPU @ 2GHz, 4 logical cores"
    monkeypatch.setattr(environment.os, "cpu_count", lambda: None)
    assert environment.cpu_name() == "Some CPU @ 2GHz"
    cpuinfo.write_text("processor\t: 0\n")
    monkeypatch.setattr(environment.platform, "processor", lambda: "")
    monkeypatch.setattr(environment.platform, "machine", lambda: "riscv64")
    assert environment.cpu_name() == "riscv64"
    monkeypatch.setattr(environment.platform, "machine", lambda: "")
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 4)
    assert environment.cpu_name() is None
    cpuinfo.unlink()  # no /proc/cpuinfo: platform's answer
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    assert environment.cpu_name() == "arm, 4 logical cores"


def test_environment_rows_leave_unknown_values_out(monkeypatch) -> None:
    from datetime import datetime, timedelta, timezone

    monkeypatch.setattr(environment, "commit", lambda root: None)
    monkeypatch.setattr(environment, "cpu_name", lambda: "cpu")
    monkeypatch.setattr(environment, "_host_family", lambda: None)
    monkeypatch.setattr(environment.platform, "platform", lambda: "Linux-x")
    created = datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=timezone(timedelta(hours=1)))
    rows = environment.environment(None, created)
    assert rows[0] == ["created (UTC)", "2026-01-02T03:04:05+01:00"]
    assert rows[-2:] == [["platform", "Linux-x"], ["CPU", "cpu"]]
    import pytest_qaccuracy.report.summary as report_summary

    monkeypatch.setattr(report_summary, "versions", lambda: {"python": "3.x", "onnx": None, "numpy": "2"})
    rows = environment.environment(None, created)  # no commit, no onnx, no family: left out
    assert rows == [
        ["created (UTC)", "2026-01-02T03:04:05+01:00"],
        ["python", "3.x"],
        ["numpy", "2"],
        ["platform", "Linux-x"],
        ["CPU", "cpu"],
    ]
    monkeypatch.setattr(environment, "commit", lambda root: f"c-{root}")
    monkeypatch.setattr(environment, "_host_family", lambda: "avx2")
    rows = environment.environment("r", created)
    assert rows[1] == ["commit", "c-r"] and rows[-1] == ["onnxruntime int8 family", "avx2"]
    now = environment.environment()[0][1]
    assert now.endswith("+00:00") and len(now) == len("2026-01-02T03:04:05+00:00")


def test_host_family_failure_leaves_the_row_out(monkeypatch) -> None:
    import pytest_qaccuracy.backend.host as host

    def broken():
        raise RuntimeError("probe failed")

    monkeypatch.setattr(host, "host_preset", broken)
    assert environment._host_family() is None
    monkeypatch.setattr(host, "host_preset", lambda: "avx2")
    assert environment._host_family() == "avx2"


# --- html -----------------------------------------------------------------------------------------


def test_embedded_json_is_safe_inside_a_script() -> None:
    text = html.embed_json({"a": "</script><!--&", "b": [1.5, None], "é": "\u2028"})
    assert text == '{"a":"\\u003c/script\\u003e\\u003c!--\\u0026","b":[1.5,null],"\\u00e9":"\\u2028"}'
    with pytest.raises(ValueError):
        html.embed_json({"x": float("nan")})


def test_first_metric(make_result) -> None:
    rows = [("t", "Conv", {"mse": 1.0, "cosine": 0.5, "sqnr": 3.0})]
    assert html.first_metric(make_result(rows)) == "sqnr"
    assert html.first_metric(make_result(rows, definitions={"mse": "m", "cosine": "c"})) == "cosine"
    assert html.first_metric(make_result(rows, definitions={"mpeir": "p", "mse": "m"})) == "mse"
    assert html.first_metric(make_result(rows, definitions={"mpeir": "p", "tae": "t"})) == "mpeir"
    assert html.first_metric(make_result([], definitions={})) is None


def test_pair_data_titles_and_ids(small_result) -> None:
    data = html.pair_data(small_result, 3)
    assert data["index"] == 3 and data["id"] == "pair-3"
    assert data["title"] == "net.int8.onnx vs net.onnx" and data["first_metric"] == "sqnr"
    assert data["targets"] is None and data["sensitivity"] is None
    named = html.pair_data(html.ReportPair(small_result, name="test_a[x]", targets={"cpu": 1}))
    assert named["title"] == "test_a[x]: net.int8.onnx vs net.onnx" and named["targets"] == {"cpu": 1}
    assert named["index"] == 0 and named["id"] == "pair-0"


def test_graph_block_without_a_model_or_a_metric(small_result, make_result) -> None:
    note = {"note": "no graph: the fp32 model was not available to this report"}
    assert html.graph_block(html.ReportPair(small_result), 0) == (note, "")
    assert html.graph_block(html.ReportPair(make_result([], definitions={}), model=object()), 0) == (note, "")


def test_graph_block_holder_and_anchors(small_result, small_model, monkeypatch) -> None:
    import pytest_qaccuracy.report.drawing as drawing
    import pytest_qaccuracy.report.graph as graph

    seen = {}

    def build(model, result, metric, anchors):
        seen.update(metric=metric, anchors=anchors)
        return "graph"

    monkeypatch.setattr(graph, "build_graph", build)
    monkeypatch.setattr(
        drawing,
        "render_graph",
        lambda g, engine: dataclasses.make_dataclass("D", ["svg", "engine", "nodes"])("<svg/>", engine, 5),
    )
    entry, holder = html.graph_block(html.ReportPair(small_result, model=small_model), 2, "built-in")
    assert entry == {"metric": "sqnr", "label": "SQNR", "engine": "built-in", "nodes": 5}
    assert holder == '<div class="graph-src" id="pair-2-graph-src" hidden><svg/></div>'
    assert seen["metric"] == "sqnr"
    assert seen["anchors"] == {
        "conv1_out": "pair-2-layer-0",
        "relu1_out": "pair-2-layer-1",
        "conv2_out": "pair-2-layer-2",
        "logits": "pair-2-layer-3",  # a layer's anchor wins over the output's of the same tensor
    }
    monkeypatch.setattr(drawing, "render_graph", lambda g, engine: None)
    assert html.graph_block(html.ReportPair(small_result, model=small_model), 0) == (
        {"note": "no graph: the model has too many nodes to draw"},
        "",
    )


def test_output_anchor_when_no_layer_has_its_tensor(make_result, small_model, monkeypatch) -> None:
    import pytest_qaccuracy.report.drawing as drawing
    import pytest_qaccuracy.report.graph as graph

    seen = {}
    monkeypatch.setattr(graph, "build_graph", lambda m, r, metric, anchors: seen.update(anchors) or "g")
    monkeypatch.setattr(drawing, "render_graph", lambda g, engine: None)
    result = make_result([("a", "Conv", {"sqnr": 1.0})], outputs=[("o1", {"sqnr": 1.0}), ("o2", {"sqnr": 2.0})])
    html.graph_block(html.ReportPair(result, model=small_model), 1)
    assert seen == {"a": "pair-1-layer-0", "o1": "pair-1-output-0", "o2": "pair-1-output-1"}


def test_per_result_lists_fill_the_pairs(small_result) -> None:
    named = html.ReportPair(small_result, name="kept")
    pairs = html._pairs([small_result, named, small_result], [None, {"s": 1}], ["a", None], [{"t": 1}])
    assert [p.name for p in pairs] == ["a", "kept", None]
    assert [p.sensitivity for p in pairs] == [None, {"s": 1}, None]
    assert [p.targets for p in pairs] == [{"t": 1}, None, None]
    assert html._pairs([small_result], None, [""], None)[0].name is None


def test_page_embeds_title_notice_summary_and_environment(small_result) -> None:
    page = html.render_html([small_result], title="A <b> & c", notice="session <interrupted>", environment=[["k", 1]])
    assert "<title>A &lt;b&gt; &amp; c</title>" in page and "<h1>A &lt;b&gt; &amp; c</h1>" in page
    assert '<p class="qa-notice" role="alert">session &lt;interrupted&gt;</p>' in page
    payload = page.split('<script type="application/json" id="qaccuracy-data">', 1)[1].split("</script>", 1)[0]
    data = json.loads(payload)
    assert data["title"] == "A <b> & c" and data["notice"] == "session <interrupted>"
    assert data["environment"] == [["k", "1"]] and len(data["pairs"]) == 1
    assert data["pairs"][0]["graph"] == {"note": "no graph: the fp32 model was not available to this report"}
    assert f"<p>{data['summary']}</p>" in page
    assert page.startswith('<!DOCTYPE html>\n<html lang="en">') and page.endswith("</html>\n")
    assert html.asset("report.css") in page and html.asset("report.js") in page
    plain = html.render_html([small_result], environment=[])
    assert '<p class="qa-notice"' not in plain and f"<title>{html.DEFAULT_TITLE}</title>" in plain


def test_page_uses_this_process_environment_by_default(small_result, monkeypatch) -> None:
    import pytest_qaccuracy.report.environment as env

    monkeypatch.setattr(env, "environment", lambda: [["who", "me"]])
    page = html.render_html([small_result])
    assert '"environment":[["who","me"]]' in page


def test_write_html_passes_every_option(tmp_path, small_result) -> None:
    path = html.write_html(
        tmp_path / "r.html",
        [small_result],
        title="T",
        sensitivity=[{"note": "n"}],
        names=["p"],
        targets=[{"cpu": {}}],
        engine="built-in",
        notice="late",
        environment=[["e", "v"]],
    )
    assert path == tmp_path / "r.html" and os.listdir(tmp_path) == ["r.html"]
    page = path.read_text()
    data = json.loads(page.split('id="qaccuracy-data">', 1)[1].split("</script>", 1)[0])
    assert data["title"] == "T" and data["notice"] == "late" and data["environment"] == [["e", "v"]]
    pair = data["pairs"][0]
    assert pair["title"].startswith("p: ") and pair["targets"] == {"cpu": {}} and pair["sensitivity"] == {"note": "n"}


def test_report_pair_from_a_plugin_record(small_result) -> None:
    record = {"id": "test_x[p]", "comparison": small_result.to_dict(), "checks": []}
    pair = html.ReportPair.from_record(record, model="m")
    assert pair.name == "test_x[p]" and pair.record is record and pair.model == "m"
    assert pair.result.to_dict() == small_result.to_dict() and pair.sensitivity is None


# --- html_data views --------------------------------------------------------------------------------


def test_entry_view_formats_and_colours_each_metric() -> None:
    from pytest_qaccuracy.report._palette import Slot

    slots = {"mse": [Slot(0.0, 1.0, "#low"), Slot(1.0, 2.0, "#high")], "sqnr": [Slot(0.0, 1.0, "#s")]}
    entry = {"tensor": "t", "metrics": {"mse": 1.5, "sqnr": None, "x": 2.0, "cosine": float("nan")}}
    view = html_data.entry_view(entry, slots)
    assert view["tensor"] == "t" and view["metrics"] is entry["metrics"]
    assert view["text"] == {"mse": "1.5", "sqnr": "n/a", "x": "2", "cosine": "nan"}
    assert view["color"] == {"mse": "#high"}
    assert "text" not in entry  # the JSON's dict is left as it was


def test_comparison_view_orders_layers_topologically(small_result) -> None:
    shuffled = dataclasses.replace(small_result, layers=list(reversed(small_result.layers)))
    view = html_data.comparison_view(shuffled)
    assert [x["order"] for x in view["layers"]] == [0, 1, 2, 3]
    assert [x["tensor"] for x in view["layers"]] == ["conv1_out", "relu1_out", "conv2_out", "logits"]
    assert view["layers"][1]["text"]["mpeir"] == "n/a" and "mpeir" not in view["layers"][1]["color"]
    assert view["layers"][0]["text"]["sqnr"] == "33.00 dB"
    assert view["outputs"][0]["text"] == {"mse": "0.01", "mpeir": "0.2", "cosine": "0.9950", "sqnr": "25.00 dB"}
    assert set(view["outputs"][0]["color"]) == {"mse", "mpeir", "cosine", "sqnr"}
    assert [m["name"] for m in view["metrics"]] == ["mse", "mpeir", "cosine", "sqnr"]


def test_metric_view(small_result, make_result) -> None:
    from pytest_qaccuracy.report._palette import metric_slots

    view = html_data.metric_view(small_result, "mse")
    assert view["name"] == "mse" and view["label"] == "MSE" and view["definition"] == "mean((f - q)^2)"
    assert view["higher_is_better"] is False and view["scale"] == "min..max of the values"
    slots = metric_slots(small_result, "mse")
    assert [s[:3] for s in view["slots"]] == [[s.begin, s.end, s.color] for s in slots]
    assert all(" – " in s[3] for s in view["slots"])
    assert view["axis"]["lo"] == 0.0 and view["axis"]["hi"] == 0.02  # from zero, no margin
    # log10 of 0.0005 and 0.02, widened by 5 % of their distance each way
    assert view["log_axis"]["lo"] == pytest.approx(-3.30103 - 0.0801030, abs=1e-5)
    assert view["log_axis"]["hi"] == pytest.approx(-1.69897 + 0.0801030, abs=1e-5)
    mpeir = html_data.metric_view(small_result, "mpeir")  # one undefined layer value is left out
    assert mpeir["axis"]["hi"] == 0.3 and mpeir["scale"] == "fixed 0..1"
    sqnr = html_data.metric_view(small_result, "sqnr")
    assert sqnr["higher_is_better"] is True and sqnr["axis"]["lo"] == pytest.approx(20 - 1.0)
    bare = make_result([("t", "Conv", {"new": 1.0})], definitions={})
    assert html_data.metric_view(bare, "new")["definition"] == ""
    slot_text = make_result([("t", "Conv", {"sqnr": 10.0}), ("u", "Conv", {"sqnr": 30.0})])
    first = html_data.metric_view(slot_text, "sqnr")["slots"][0]
    assert first[3] == f"{first[0]:.2f} dB – {first[1]:.2f} dB"


def test_sensitivity_display() -> None:
    assert html_data.sensitivity_display(None) is None and html_data.sensitivity_display({}) is None
    note = {"note": "not analysed", "recipe": ["x"]}
    shown = html_data.sensitivity_display(note)
    assert shown == note and shown is not note
    view = {
        "metric": "sqnr",
        "rows": [{"node": "a", "value": 12.5}, {"node": "b", "value": None}],
        "baseline": 10.0,
        "chart": {"y_label": "cosine", "series": [{"name": "all", "y": [0.5, None]}, {"name": "b", "y": [1.0, 0.75]}]},
    }
    out = html_data.sensitivity_display(view)
    assert out["rows"] == [
        {"node": "a", "value": 12.5, "text": "12.50 dB"},
        {"node": "b", "value": None, "text": "n/a"},
    ]
    assert out["baseline_text"] == "10.00 dB" and out["chart"] is view["chart"] and out["metric"] == "sqnr"
    assert out["chart_text"] == [["0.5000", "n/a"], ["1.0000", "0.7500"]]
    # cosine is better when higher: 0.5 .. 1.0 widened by 0.025 each way
    assert out["chart_axis"]["lo"] == pytest.approx(0.475) and out["chart_axis"]["hi"] == pytest.approx(1.025)
    assert "text" not in view["rows"][0]
    bare = html_data.sensitivity_display({"metric": "mse", "rows": [], "baseline": float("nan"), "chart": None})
    assert bare["baseline_text"] is None and "chart_axis" not in bare and "chart_text" not in bare
    unlabelled = {"metric": "sqnr", "rows": [], "chart": {"series": [{"name": "a", "y": [10.0]}]}}
    shown = html_data.sensitivity_display(unlabelled)
    assert shown["chart_text"] == [["10.00 dB"]] and shown["baseline_text"] is None
    assert shown["chart_axis"]["ticks"][0][1].endswith(" dB")


# --- against the first run's survivors ----------------------------------------------------------------


def _page_data(path: Path) -> dict:
    page = path.read_text()
    return json.loads(page.split('id="qaccuracy-data">', 1)[1].split("</script>", 1)[0])


def _outcome(passed: bool) -> dict:
    from pytest_qaccuracy.outcomes import Outcome

    fields = {"kind": "tolerance", "check": "sqnr", "scope": "output", "subject": "output 'logits'"}
    fields |= {"metric": "sqnr", "op": ">=", "threshold": 30.0, "value": 25.0, "passed": passed}
    return Outcome(**fields, source="marker", detail="sqnr 25 < 30").to_dict()


def test_stem_strips_only_dots_and_underscores() -> None:
    assert artifacts.artifact_stem("XaX", "k").startswith("XaX-")


def test_refusals_start_with_the_option(tmp_path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(InputError) as info:
        artifacts.check_artifact_targets(tmp_path / "dir", None, "s", ["mse"])
    assert str(info.value).startswith(f"--json {tmp_path / 'dir'}: ")
    out = tmp_path / "out"
    (out / "s.comparison.json").mkdir(parents=True)  # a folder where the set writes a file
    with pytest.raises(InputError) as info:
        artifacts.check_artifact_targets(None, out, "s", ["mse"])
    assert str(info.value) == f"--out-dir {out}: s.comparison.json exists there as a directory"


def test_report_html_carries_the_checks_and_the_graph(tmp_path, small_result, small_model) -> None:
    checks = [_outcome(False), _outcome(True)]
    artifacts.write_comparison_artifacts(small_result, small_model, out_dir=tmp_path / "a", checks=checks)
    pair = _page_data(tmp_path / "a" / "report.html")["pairs"][0]
    assert pair["verdict"]["status"] == "failed" and pair["verdict"]["detail"] == "1 / 2 checks passed"
    assert len(pair["checks"]) == 2 and pair["graph"]["metric"] == "sqnr"
    artifacts.write_comparison_artifacts(small_result, small_model, out_dir=tmp_path / "b")
    unchecked = _page_data(tmp_path / "b" / "report.html")["pairs"][0]
    assert unchecked["verdict"]["status"] == "unchecked" and unchecked["checks"] == []


def test_a_second_write_replaces_the_first(tmp_path, small_result, small_model) -> None:
    artifacts.write_comparison_artifacts(small_result, small_model, out_dir=tmp_path)
    first = sorted(os.listdir(tmp_path))
    (tmp_path / "notes.txt").write_text("mine")
    again = dataclasses.replace(small_result, records=99)
    artifacts.write_comparison_artifacts(again, small_model, out_dir=tmp_path)
    assert json.loads((tmp_path / "net.int8.comparison.json").read_text())["records"] == 99  # not the old copy
    assert sorted(os.listdir(tmp_path)) == sorted([*first, "notes.txt"])  # the user's file carried over


def test_write_failures_name_the_option_and_the_path(tmp_path, small_result, small_model) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for kwargs, option, path in (
        ({"json_path": blocker / "c.json"}, "--json", blocker / "c.json"),
        ({"out_dir": blocker / "out"}, "--out-dir", blocker / "out"),
    ):
        with pytest.raises(InputError) as info:
            artifacts.write_comparison_artifacts(small_result, small_model, **kwargs)
        assert str(info.value).startswith(f"{option} {path}: could not be written (")
        with pytest.raises(InputError) as info:
            tables.write_sensitivity_artifacts("s", sweep=_sweep(), **kwargs)
        assert str(info.value).startswith(f"{option} {path}: could not be written (")


def test_a_second_sensitivity_write_replaces_the_first(tmp_path) -> None:
    tables.write_sensitivity_artifacts("s", tmp_path, sweep=_sweep())
    tables.write_sensitivity_artifacts("s", tmp_path, sweep=_sweep(target=None))
    assert os.listdir(tmp_path) == ["s.sweep.json"]
    assert json.loads((tmp_path / "s.sweep.json").read_text())["target"] is None  # not the old copy


def test_sweep_table_takes_its_columns_from_the_first_step() -> None:
    one = dataclasses.replace(_sweep(target=None), steps=[SweepStep(0, [], {"cosine": 0.5})])
    lines = tables.sweep_table(one).splitlines()
    assert lines[1].split() == ["k", "kept", "in", "float", "cosine"] and lines[3].split() == ["0", "(none)", "0.5"]


def test_figures_of_two_targets_and_two_checks() -> None:
    measured = {"cpu": {"out": {"cosine": 0.99, "sqnr": 30.0}}, "npu": {"out": {"cosine": 0.95, "sqnr": 15.0}}}
    sqnr = Check("sqnr", 20.0, True)
    step = _step(0, measured, True)
    assert recipe_tables.step_line(step, None, [COSINE, sqnr]).split(": cost 1, ")[1] == (
        "cosine 0.9900 (cpu), 0.9500 (npu); sqnr 30.00 dB (cpu), 15.00 dB (npu): meets the target, 1.5s"
    )
    result = _recipe_result([step], 0, (COSINE, sqnr), ("cpu", "npu"))
    assert recipe_tables.verdict_lines(result)[0].endswith(
        ": cosine 0.9900 on cpu, cosine 0.9500 on npu; sqnr 30.00 dB on cpu, sqnr 15.00 dB on npu; cost 1 (step 0)"
    )
    line = recipe_tables.pair_data_line({"records": 5, "measured": measured, "met": True}, [COSINE, sqnr])
    assert line.endswith(
        ": cosine 0.9900 on cpu, cosine 0.9500 on npu; sqnr 30.00 dB on cpu, sqnr 15.00 dB on npu: meets"
    )


@needs_cache
def test_write_recipe_script_and_ranges(tmp_path) -> None:
    result = _written_result(tmp_path, ranges={"conv_out": (-1.5, 2.0)}, convert_opset=13)
    result.arguments["calibration_cache_path"] = None
    out = tmp_path / "deep" / "er"  # parents made
    recipe_tables.write_recipe(result, out, tmp_path / "net.onnx", tmp_path / "c.h5")
    script = (out / "net.recipe.py").read_text()
    assert "convert_version(onnx.load(fp32), 13)" in script and str(out / "net.recipe.onnx") in script
    ranges = json.loads((out / "net.ranges.json").read_text())
    assert "conv_out" in json.dumps(ranges)
    plain = _written_result(tmp_path)  # no cache: our data reader, on the first 4 records
    recipe_tables.write_recipe(plain, tmp_path / "p", tmp_path / "net.onnx", tmp_path / "c.h5", records=4)
    script = (tmp_path / "p" / "net.recipe.py").read_text()
    assert "reader.set_range(0, 4)" in script and "version_converter.convert_version" not in script


def test_sensitivity_lines_cut_at_top_and_add_the_task_suggestion() -> None:
    report = SensitivityReport("s", _sensitivity(), None)
    task = {"check": "max:wer", "threshold": 0.5, "records": 2, "steps": [], "suggestion": None}
    lines = summary.sensitivity_lines(_record(report, task=task), top=2)
    assert "  ... 2 more node(s)" in lines
    assert lines[-1] == "  target max:wer <= 0.5 (task metric, 2 records, ): not met with up to 0 nodes in float"


def test_cumulative_table_refuses_nodes_and_op_types_of_different_lengths() -> None:
    with pytest.raises(ValueError):
        tables.cumulative_table(dataclasses.replace(_cumulative(), op_types=["Conv"]))


def test_cpu_name_reads_utf8_and_keeps_colons_in_the_name(monkeypatch, tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_bytes(b"model name\t: Caf\xe9 X: 9 @ 2GHz\n")  # not UTF-8: replaced, not an error
    real_open = open
    opened = []

    def fake_open(path, *args, **kwargs):
        opened.append(kwargs)
        return real_open(cpuinfo if path == "/proc/cpuinfo" else path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 2)
    assert environment.cpu_name() == "Caf\ufffd X: 9 @ 2GHz, 2 logical cores"
    assert opened[0] == {"encoding": "utf-8", "errors": "replace"}


def test_git_is_given_ten_seconds(monkeypatch, tmp_path) -> None:
    for name in environment.COMMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    seen = {}

    def run(args, **kwargs):
        seen.update(kwargs)
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    monkeypatch.setattr(environment.subprocess, "run", run)
    assert environment.commit(tmp_path) is None and seen["timeout"] == 10


def test_assets_are_the_package_files() -> None:
    folder = Path(html.__file__).parent / "assets"
    html.asset.cache_clear()  # read the files again, not what an earlier test left in the cache
    for name in ("report.css", "report.js"):
        assert html.asset(name) == (folder / name).read_text(encoding="utf-8")


def test_header_without_a_notice(small_result) -> None:
    page = html.render_html([small_result], environment=[])
    data = json.loads(page.split('id="qaccuracy-data">', 1)[1].split("</script>", 1)[0])
    assert f"<p>{data['summary']}</p></div></header>" in page and data["notice"] is None


def test_pair_data_carries_the_records_checks_drift_topk_and_task(small_result) -> None:
    drift = {**_outcome(True), "kind": "drift", "check": "drift", "detail": "moved"}
    record = {
        "checks": [_outcome(False), drift],
        "topk": {"logits": {"k": {"1": {"agreement": 0.5}}}},
        "task": {"cer": {"metric": "cer", "fp32": 0.1, "quantized": 0.2, "drop": 0.1, "records": 3}},
    }
    data = html.pair_data(html.ReportPair(small_result, record=record))
    assert data["verdict"]["status"] == "failed" and data["verdict"]["detail"] == "1 / 2 checks passed"
    assert len(data["checks"]) == 1 and len(data["drift"]) == 1  # the drift check in its own table
    assert len(data["topk"]) == 1 and len(data["task"]) == 1
    bare = html.pair_data(small_result)
    assert bare["verdict"]["status"] == "unchecked"
    assert bare["checks"] == [] and bare["drift"] == [] and bare["topk"] == [] and bare["task"] == []


def test_report_pair_from_a_record_with_sensitivity_and_targets(small_result, monkeypatch) -> None:
    import pytest_qaccuracy.report.summary as report_summary

    monkeypatch.setattr(report_summary, "target_view", lambda record: {"from": record["id"]})
    record = {"id": "p", "comparison": small_result.to_dict(), "checks": []}
    record["sensitivity"] = {"mode": "single", "metric": "sqnr", "error": "boom"}
    pair = html.ReportPair.from_record(record)
    assert pair.targets == {"from": "p"} and pair.sensitivity == {"note": "sensitivity not analysed: boom"}


def test_every_pair_gets_its_index_and_its_graph(small_result, small_model) -> None:
    pairs = [html.ReportPair(small_result, model=small_model), html.ReportPair(small_result, model=small_model)]
    page = html.render_html(pairs, engine="built-in", environment=[])
    data = json.loads(page.split('id="qaccuracy-data">', 1)[1].split("</script>", 1)[0])
    assert [p["id"] for p in data["pairs"]] == ["pair-0", "pair-1"] and [p["index"] for p in data["pairs"]] == [0, 1]
    assert [p["graph"]["engine"] for p in data["pairs"]] == ["built-in", "built-in"]
    assert '</svg></div>\n<div class="graph-src" id="pair-1-graph-src" hidden>' in page
    assert page.count('<div class="graph-src" id="pair-0-graph-src" hidden><svg') == 1


def test_default_engine_is_graphviz_when_installed(tmp_path, small_result, small_model) -> None:
    import shutil

    expected = "graphviz" if shutil.which("dot") else "built-in"
    pair = html.ReportPair(small_result, model=small_model)
    assert html.graph_block(pair, 0)[0]["engine"] == expected
    data = _page_data(html.write_html(tmp_path / "a.html", [pair], environment=[]))
    assert data["pairs"][0]["graph"]["engine"] == expected
    data = _page_data(html.write_html(tmp_path / "b.html", [pair], engine="built-in", environment=[]))
    assert data["pairs"][0]["graph"]["engine"] == "built-in"


def test_log_ticks_at_the_tolerance_edges() -> None:
    assert html_data.ticks(1e-9, 2.0, log=True) == [0.0, 1.0, 2.0]  # 0 >= 1e-9 - 1e-9
    hi = 2.0 - 1e-9
    assert hi + 1e-9 == 2.0 and html_data.ticks(0.0, hi, log=True) == [0.0, 1.0, 2.0]


def test_linear_ticks_reach_hi_within_the_tolerance() -> None:
    hi = 10.0 - 2e-9
    assert hi + 2.0 * 1e-9 == 10.0 and html_data.ticks(0.0, hi)[-1] == 10.0


def test_scale_of_a_better_when_higher_metric_in_its_view(small_result) -> None:
    assert html_data.metric_view(small_result, "sqnr")["scale"] == "min..max of the values (dark red = lowest)"


# --- publish, against the first run's survivors -------------------------------------------------------


def test_publish_refusals_name_the_option(tmp_path, monkeypatch) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError) as info:
        publish.check_publishable(tmp_path / "file", "--o", ())
    assert str(info.value).startswith(f"--o {tmp_path / 'file'}: ")
    out = tmp_path / "out"
    out.mkdir()
    (out / "d1").mkdir()
    (out / "a_link").symlink_to(tmp_path / "file")
    with pytest.raises(InputError) as info:
        publish.check_publishable(out, "--o", ())
    assert str(info.value).startswith(f"--o {out}: holds a_link, d1/, not written by pytest-qaccuracy; ")
    modes = []

    def access(path, mode):
        modes.append((path, mode))
        return path != tmp_path  # the folder is writable, its parent is not

    monkeypatch.setattr(publish.os, "access", access)
    with pytest.raises(InputError) as info:
        publish.check_publishable(out, "--o", {"d1", "a_link"})
    assert str(info.value) == f"--o {out}: cannot be replaced, {tmp_path} is not writable"
    assert (tmp_path, os.W_OK | os.X_OK) in modes


def test_check_out_dir_accepts_its_own_files(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.json").write_text("{}")
    publish.check_out_dir(out, "--out-dir", {"a.json"})
    (out / "b.json").mkdir()
    with pytest.raises(InputError) as info:
        publish.check_out_dir(out, "--out-dir", {"a.json", "b.json"})
    assert str(info.value) == f"--out-dir {out}: b.json exists there as a directory"


def test_files_are_copied_where_they_cannot_be_linked(tmp_path, monkeypatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes").write_text("mine")

    def no_link(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(publish.os, "link", no_link)
    publish.publish_folder(out, lambda stage: (stage / "a").write_text("1"), {"a"})
    assert sorted(os.listdir(out)) == ["a", "notes"] and (out / "notes").read_text() == "mine"


def test_publish_makes_every_missing_parent(tmp_path) -> None:
    out = tmp_path / "a" / "b" / "out"
    publish.publish_folder(out, lambda stage: (stage / "x").write_text("1"), {"x"})
    assert (out / "x").read_text() == "1"


def test_exchange_elsewhere_than_linux_or_without_renameat2(tmp_path, monkeypatch, request) -> None:
    import ctypes
    import errno

    request.addfinalizer(publish._renameat2.cache_clear)  # the next test looks the real one up again
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "in_a").write_text("")
    publish._renameat2.cache_clear()
    monkeypatch.setattr(publish.sys, "platform", "darwin")
    assert publish._exchange(a, b) is False
    publish._renameat2.cache_clear()
    monkeypatch.setattr(publish.sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: object())
    assert publish._exchange(a, b) is False

    class Library:
        @staticmethod
        def renameat2(*args):
            ctypes.set_errno(errno.EINVAL)  # a filesystem without RENAME_EXCHANGE
            return -1

    publish._renameat2.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: Library())
    assert publish._exchange(a, b) is False
    assert os.listdir(a) == ["in_a"] and os.listdir(b) == []


def test_renameat2_is_looked_up_once(monkeypatch, request) -> None:
    import ctypes

    request.addfinalizer(publish._renameat2.cache_clear)
    publish._renameat2.cache_clear()
    opened = []
    monkeypatch.setattr(publish.sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: opened.append(args) or object())
    assert publish._renameat2() is None and publish._renameat2() is None
    assert opened == [(None,)]


def test_exchange_failure_carries_errno_and_relative_paths_work(tmp_path, monkeypatch) -> None:
    import errno

    monkeypatch.chdir(tmp_path)
    Path("a").mkdir()
    Path("b").mkdir()
    (tmp_path / "a" / "in_a").write_text("")
    assert publish._exchange(Path("a"), Path("b")) is True
    assert os.listdir(tmp_path / "b") == ["in_a"]
    with pytest.raises(OSError) as info:
        publish._exchange(Path("a"), Path("missing"))
    assert info.value.errno == errno.ENOENT and info.value.strerror == os.strerror(errno.ENOENT)


def test_swap_when_another_publisher_got_there_first(tmp_path, monkeypatch) -> None:
    import errno

    out = tmp_path / "out"
    real = os.rename

    def racing(src, dst):
        out.mkdir()  # another session published meanwhile
        (out / "theirs").write_text("")
        monkeypatch.setattr(publish.os, "rename", real)
        raise OSError(errno.EEXIST, "File exists")

    monkeypatch.setattr(publish.os, "rename", racing)
    publish.publish_folder(out, lambda stage: (stage / "a").write_text("1"), {"a", "theirs"})
    assert os.listdir(out) == ["a"] and os.listdir(tmp_path) == ["out"]

    def refused(src, dst):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(publish.os, "rename", refused)
    with pytest.raises(OSError) as info:
        publish.publish_folder(tmp_path / "other", lambda stage: None, ())
    assert info.value.errno == errno.EACCES and os.listdir(tmp_path) == ["out"]


def test_two_renames_put_the_old_folder_back_when_the_second_fails(tmp_path, monkeypatch) -> None:
    import errno

    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("old")
    monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    real, calls = os.rename, []

    def second_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(publish.os, "rename", second_fails)
    with pytest.raises(OSError):
        publish.publish_folder(out, lambda stage: (stage / "a").write_text("new"), {"a"})
    assert (out / "a").read_text() == "old" and os.listdir(tmp_path) == ["out"]
    assert calls[2] == (calls[0][1], out)  # the old folder renamed back


def test_render_html_draws_with_graphviz_by_default_when_installed(small_result, small_model) -> None:
    import shutil

    page = html.render_html([html.ReportPair(small_result, model=small_model)], environment=[])
    data = json.loads(page.split('id="qaccuracy-data">', 1)[1].split("</script>", 1)[0])
    assert data["pairs"][0]["graph"]["engine"] == ("graphviz" if shutil.which("dot") else "built-in")
