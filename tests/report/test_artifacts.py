"""One naming scheme for a comparison's files, from the command line and from a pytest session."""

from __future__ import annotations

import hashlib
import json

from pytest_qaccuracy.report.artifacts import (
    artifact_names,
    artifact_stem,
    session_dot_metrics,
    write_comparison_artifacts,
    write_comparison_files,
)
from pytest_qaccuracy.report.dot import dot_document
from pytest_qaccuracy.report.visq import visq_document

METRICS = ["mse", "mpeir", "cosine", "sqnr"]  # small_result's, in its order


def test_command_line_stem_is_the_quantized_file_stem_as_given() -> None:
    assert artifact_stem("net.qdq_u8") == "net.qdq_u8"
    assert artifact_stem("my model (int8)") == "my model (int8)"


def test_session_stem_is_the_safe_id_and_a_hash_of_the_key() -> None:
    hash8 = hashlib.sha256(b"k1").hexdigest()[:8]
    assert artifact_stem("a/b c", "k1") == f"a_b_c-{hash8}"
    assert artifact_stem("a/b c", "k2") != artifact_stem("a/b c", "k1")
    assert artifact_stem("...", "k1") == f"pair-{hash8}"
    assert artifact_stem("x" * 100, "k1") == "x" * 60 + f"-{hash8}"


def test_files_are_named_by_stem_and_metric(tmp_path, small_result, small_model) -> None:
    files = write_comparison_files(tmp_path / "out", "net", small_result, small_model, ["sqnr"])
    names = ["net.comparison.json", *(f"net.{m}.visq.json" for m in METRICS), "net.sqnr.dot"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(names)
    assert [p.name for p in files.paths()] == [names[0], *names[1:5], "net.sqnr.dot"]
    assert list(files.visq) == METRICS and list(files.dot) == ["sqnr"]
    assert json.loads(files.comparison.read_text()) == small_result.to_dict()
    for metric, path in files.visq.items():
        assert json.loads(path.read_text()) == visq_document(small_result, metric)
    assert files.dot["sqnr"].read_text() == dot_document(small_model, small_result, "sqnr")


def test_every_metric_gets_a_dot_by_default_and_none_without_a_model(tmp_path, small_result, small_model) -> None:
    every = write_comparison_files(tmp_path / "a", "n", small_result, small_model)
    assert list(every.dot) == METRICS
    assert [p.name for p in every.paths()][1:3] == ["n.mse.visq.json", "n.mse.dot"]
    none = write_comparison_files(tmp_path / "b", "n", small_result, None, ["sqnr"])
    assert none.dot == {} and not list((tmp_path / "b").glob("*.dot"))


def test_command_line_writes_the_names_it_checked(tmp_path, small_result, small_model) -> None:
    written = write_comparison_artifacts(small_result, small_model, out_dir=tmp_path)
    expected = artifact_names("net.int8", METRICS)  # the stem of models/net.int8.onnx
    assert [p.name for p in written] == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
    assert len(expected) == 2 + 2 * len(METRICS)


def test_a_session_draws_the_graph_the_report_shows_first() -> None:
    assert session_dot_metrics(["mse", "cosine", "sqnr"]) == ["sqnr"]
    assert session_dot_metrics(["mse", "cosine"]) == ["cosine"]
    assert session_dot_metrics(["tae", "mse"]) == ["mse"]
    assert session_dot_metrics(["tae", "lsb"]) == []
