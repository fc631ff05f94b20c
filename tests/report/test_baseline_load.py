"""A baseline file that cannot be used is refused with its name and the bad key (issue 35)."""

from __future__ import annotations

import json

import pytest

from pytest_qaccuracy.report.baseline import BaselineStatus, load_baseline

GOOD = {
    "schema_version": 1,
    "higher_is_better": {"sqnr": True, "mse": False},
    "outputs": {"logits": {"sqnr": 30.5, "mse": None}},
    "layers": {"relu1": {"sqnr": 41, "mse": 0.01}},
}


def _edit(document: dict, path: list[str], value: object) -> dict:
    edited = json.loads(json.dumps(document))
    target = edited
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return edited


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (["layers", "relu1", "sqnr"], "abc", "layers.'relu1'.sqnr: 'abc' is not a number"),
        (["outputs", "logits", "mse"], True, "outputs.'logits'.mse: True is not a number"),
        (["outputs", "logits"], [1.0], "outputs.'logits': expected a table of metric -> number"),
        (["layers"], [], "layers: expected a table of layer -> metrics"),
        (["higher_is_better", "sqnr"], "yes", "higher_is_better: expected a table of true/false by metric"),
        (["schema_version"], 7, "unsupported baseline schema_version 7"),
    ],
)
def test_a_bad_value_names_the_file_and_the_key(tmp_path, path, value, reason) -> None:
    file = tmp_path / "pair-1a2b3c4d.json"
    file.write_text(json.dumps(_edit(GOOD, path, value)))
    with pytest.raises(ValueError) as info:
        load_baseline(file)
    assert str(info.value) == f"{file}: {reason}"


def test_files_that_are_not_json_and_good_files(tmp_path) -> None:
    file = tmp_path / "b.json"
    assert load_baseline(file) is None  # none yet
    file.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match=r"b\.json: not valid JSON \("):
        load_baseline(file)
    file.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"b\.json: unsupported baseline schema_version None"):
        load_baseline(file)
    file.write_text(json.dumps(GOOD))
    assert load_baseline(file) == GOOD


def test_an_unreadable_baseline_is_counted_apart_from_the_compared_ones() -> None:
    status = BaselineStatus(".qaccuracy-baselines", False, compared=("a",), unreadable=("b",), missing=())
    assert status.line() == (
        "baselines .qaccuracy-baselines: compared 1, not compared (unreadable) 1 (b), missing 0, stale 0"
    )
    assert "unreadable" not in BaselineStatus("d", False, compared=("a",)).line()
