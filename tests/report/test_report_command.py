"""``qaccuracy report DIR``: finds comparison JSON files, writes report.html, exit 2 on bad input."""

from __future__ import annotations

import json
import re

from pytest_qaccuracy.cli import main

DATA = re.compile(r'<script type="application/json" id="qaccuracy-data">(.*?)</script>', re.S)


def pairs_in(path):
    return json.loads(DATA.search(path.read_text(encoding="utf-8"))[1])["pairs"]


def test_builds_report_from_nested_files(tmp_path, small_result, make_result, capsys):
    other = make_result([("t", "Conv", {"mse": 0.5})], definitions={"mse": "x"}, quantized_model="b.int8.onnx")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "net.comparison.json").write_text(json.dumps(small_result.to_dict()))
    (tmp_path / "copy.json").write_text(json.dumps(small_result.to_dict()))  # same comparison: shown once
    (tmp_path / "z" / "deep").mkdir(parents=True)
    (tmp_path / "z" / "deep" / "b.json").write_text(json.dumps(other.to_dict()))
    (tmp_path / "net.mse.visq.json").write_text('{"meta": {}, "error": [{}]}')  # other JSON: skipped
    (tmp_path / "notes.txt").write_text("{ not json")
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'report.html'} (2 comparisons)" in out
    pairs = pairs_in(tmp_path / "report.html")
    assert [p["quantized_model"] for p in pairs] == ["models/net.int8.onnx", "b.int8.onnx"]


def test_out_and_title(tmp_path, small_result):
    (tmp_path / "r.json").write_text(json.dumps(small_result.to_dict()))
    out = tmp_path / "site" / "index.html"
    assert main(["report", str(tmp_path), "--out", str(out), "--title", "Nightly"]) == 0
    assert "<title>Nightly</title>" in out.read_text(encoding="utf-8")
    assert not (tmp_path / "report.html").exists()


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_missing_dir(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "nope: no such directory" in error_line(capsys)


def test_no_results(tmp_path, capsys):
    (tmp_path / "x.visq.json").write_text('{"meta": {}, "error": [{}]}')
    assert main(["report", str(tmp_path)]) == 2
    assert "no comparison JSON files found" in error_line(capsys)
    assert not (tmp_path / "report.html").exists()


def test_malformed_json_names_the_file(tmp_path, small_result, capsys):
    (tmp_path / "good.json").write_text(json.dumps(small_result.to_dict()))
    (tmp_path / "bad.json").write_text('{"schema_version": 1, "layers": [')
    assert main(["report", str(tmp_path)]) == 2
    assert f"{tmp_path / 'bad.json'}: malformed JSON" in error_line(capsys)
    assert not (tmp_path / "report.html").exists()


def test_broken_comparison_names_the_file(tmp_path, small_result, capsys):
    data = small_result.to_dict()
    del data["fp32_model"]
    (tmp_path / "broken.json").write_text(json.dumps(data))
    assert main(["report", str(tmp_path)]) == 2
    assert f"{tmp_path / 'broken.json'}: not a valid comparison JSON (missing key 'fp32_model')" in error_line(capsys)
    (tmp_path / "broken.json").write_text(json.dumps({**small_result.to_dict(), "schema_version": 99}))
    assert main(["report", str(tmp_path)]) == 2
    assert "unsupported comparison schema_version 99" in error_line(capsys)


def test_never_replaces_a_file_it_did_not_write(tmp_path, small_result, capsys):
    """Pointed at the plugin's ``.qaccuracy/``, it keeps the plugin's report unless told (``--force``);
    a page it wrote itself it rebuilds freely."""
    (tmp_path / "r.json").write_text(json.dumps(small_result.to_dict()))
    theirs = tmp_path / "report.html"
    theirs.write_text("<!DOCTYPE html><title>the plugin's report</title>\n")
    assert main(["report", str(tmp_path)]) == 2
    assert error_line(capsys) == (
        f"error: --out {theirs}: exists and was not written by qaccuracy report; "
        "pass --force to replace it, or --out to write elsewhere\n"
    )
    assert theirs.read_text() == "<!DOCTYPE html><title>the plugin's report</title>\n"
    mine = tmp_path / "mine.html"
    assert main(["report", str(tmp_path), "--out", str(mine)]) == 0
    assert main(["report", str(tmp_path), "--out", str(mine), "--title", "Again"]) == 0  # its own page
    assert "<title>Again</title>" in mine.read_text(encoding="utf-8")
    assert main(["report", str(tmp_path), "--force"]) == 0
    assert pairs_in(theirs)[0]["quantized_model"] == "models/net.int8.onnx"
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 0  # written by the command now: no --force needed
