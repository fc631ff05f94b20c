"""``qaccuracy report`` in pieces: which files it replaces, reads and counts as one comparison."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from pytest_qaccuracy.cli import main
from pytest_qaccuracy.commands.report import WRITTEN_BY, check_replaceable, load_comparison, load_comparisons
from pytest_qaccuracy.errors import InputError


def test_the_marker_counts_only_in_the_last_256_bytes(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(WRITTEN_BY)  # the whole file is the marker: read from byte 0
    check_replaceable(page, force=False)
    page.write_text(WRITTEN_BY + "x" * (256 - len(WRITTEN_BY)))  # the marker is the first of the last 256 bytes
    check_replaceable(page, force=False)
    page.write_text(WRITTEN_BY + "x" * (257 - len(WRITTEN_BY)))  # one byte too far from the end
    with pytest.raises(InputError, match="was not written by qaccuracy report"):
        check_replaceable(page, force=False)
    check_replaceable(page, force=True)
    check_replaceable(tmp_path / "missing.html", force=False)


def test_a_tail_that_is_not_utf8_is_still_searched(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_bytes(b"\xff\xfe" + WRITTEN_BY.encode() + b"\n")
    check_replaceable(page, force=False)
    page.write_bytes(b"\xff\xfe<html>\n")
    with pytest.raises(InputError, match="was not written"):
        check_replaceable(page, force=False)


def test_an_unreadable_output_file_is_one_error_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "report.html"
    page.write_text("x")

    def refuse(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(InputError) as info:
        check_replaceable(page, force=False)
    assert str(info.value) == f"--out {page}: cannot be read (Permission denied)"


def test_load_comparison_skips_other_json_and_names_each_failure(tmp_path: Path, small_result) -> None:
    data = small_result.to_dict()
    path = tmp_path / "x.json"
    for other in ({"schema_version": 1}, {"layers": []}, [1, 2], {"meta": {}}):
        path.write_text(json.dumps(other))
        assert load_comparison(path) is None, other
    path.write_text(json.dumps(data))
    assert load_comparison(path).to_dict() == data
    path.write_text(json.dumps({**data, "records": "many"}))
    with pytest.raises(InputError) as info:
        load_comparison(path)
    assert str(info.value) == f"{path}: not a valid comparison JSON (invalid literal for int() with base 10: 'many')"
    path.write_bytes(b'{"layers": "\xff"}')
    with pytest.raises(InputError) as info:
        load_comparison(path)
    assert str(info.value) == f"{path}: not UTF-8 text"
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(InputError) as info:
        load_comparison(folder)
    assert str(info.value) == f"{folder}: cannot read (Is a directory)"


def test_one_comparison_written_with_its_keys_in_another_order_is_shown_once(tmp_path: Path, small_result) -> None:
    data = small_result.to_dict()
    reordered = {**data, "layers": [{**x, "metrics": dict(reversed(x["metrics"].items()))} for x in data["layers"]]}
    (tmp_path / "a.json").write_text(json.dumps(data))
    (tmp_path / "b.json").write_text(json.dumps(reordered))
    found = load_comparisons(tmp_path)
    assert [path.name for path, _ in found] == ["a.json"]


def test_the_page_ends_with_the_marker_and_one_comparison_is_singular(tmp_path: Path, small_result, capsys) -> None:
    (tmp_path / "r.json").write_text(json.dumps(small_result.to_dict()))
    assert main(["report", str(tmp_path)]) == 0
    page = tmp_path / "report.html"
    assert capsys.readouterr().out == f"read {tmp_path / 'r.json'}\nwrote {page} (1 comparison)\n"
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.endswith(f"</html>\n{WRITTEN_BY}\n")


def test_an_output_that_cannot_be_written_names_the_option(tmp_path: Path, small_result, capsys) -> None:
    (tmp_path / "r.json").write_text(json.dumps(small_result.to_dict()))
    folder = tmp_path / "out.html"
    folder.mkdir()
    assert main(["report", str(tmp_path), "--out", str(folder)]) == 2
    assert capsys.readouterr().err == f"error: --out {folder}: is a directory, expected a file\n"
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["report", str(tmp_path), "--out", str(blocked / "r.html")]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --out {blocked / 'r.html'}: cannot be created, {blocked} is not a directory\n"
    )


def test_a_failed_write_names_the_option_and_leaves_no_page(tmp_path: Path, small_result, capsys, monkeypatch) -> None:
    import pytest_qaccuracy.atomic

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pytest_qaccuracy.atomic, "atomic_write_text", full)
    (tmp_path / "r.json").write_text(json.dumps(small_result.to_dict()))
    assert main(["report", str(tmp_path)]) == 2
    page = tmp_path / "report.html"
    assert (
        capsys.readouterr().err
        == f"error: --out {page}: could not be written (No space left on device); left as it was\n"
    )
    assert not page.exists()
