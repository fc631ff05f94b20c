"""Every writer goes through pytest_qaccuracy.atomic: a failure mid-way leaves neither a file nor a temp file."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy import atomic
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.report.dot import write_dot
from pytest_qaccuracy.report.html import write_html
from pytest_qaccuracy.report.visq import write_visq


def tiny_model() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["conv1_out"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("conv1_out", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph)


WRITERS = {
    "visq": lambda path, result: write_visq(path, result, "mse"),
    "dot": lambda path, result: write_dot(path, tiny_model(), result, "mse"),
    "html": lambda path, result: write_html(path, [result]),
}


@pytest.mark.parametrize("kind", WRITERS)
def test_writes_and_returns_the_path(tmp_path, small_result, kind):
    path = tmp_path / "deeper" / f"out.{kind}"
    assert WRITERS[kind](path, small_result) == path
    assert path.read_text(encoding="utf-8")
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize("kind", WRITERS)
def test_failure_mid_write_leaves_nothing(tmp_path, small_result, monkeypatch, kind):
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        WRITERS[kind](tmp_path / f"out.{kind}", small_result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", WRITERS)
def test_failure_keeps_the_old_file(tmp_path, small_result, monkeypatch, kind):
    path = tmp_path / f"out.{kind}"
    path.write_text("old")

    def broken_fsync(fd):
        raise OSError("I/O error")

    monkeypatch.setattr(atomic.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="I/O error"):
        WRITERS[kind](path, small_result)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("kind", ["visq", "dot"])
def test_bad_metric_writes_nothing(tmp_path, small_result, kind):
    writer = {
        "visq": lambda p: write_visq(p, small_result, "tae"),
        "dot": lambda p: write_dot(p, tiny_model(), small_result, "tae"),
    }
    with pytest.raises(InputError):
        writer[kind](tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_the_mode_a_plain_open_would_give(tmp_path):
    """mkstemp creates 0600 files; artifacts must be as readable as any file the user writes."""
    import stat

    plain = tmp_path / "plain.txt"
    with open(plain, "w", encoding="utf-8") as handle:
        handle.write("x")
    expected = stat.S_IMODE(plain.stat().st_mode)
    assert expected != 0o600, "umask 077 here: this test cannot tell the modes apart"
    for path in (atomic.atomic_write_text(tmp_path / "a.txt", "x"), atomic.atomic_write_json(tmp_path / "b.json", {})):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path.name


def _interrupt(real, after: bool):
    """``real`` that raises KeyboardInterrupt before it runs, or just after it returns (as a signal
    landing between a syscall and the assignment of its result does)."""

    def call(*args, **kwargs):
        if not after:
            raise KeyboardInterrupt
        result = real(*args, **kwargs)
        if real is atomic.os.open:
            atomic.os.close(result)
        raise KeyboardInterrupt

    return call


@pytest.mark.parametrize(
    ("name", "after"),
    [("open", False), ("open", True), ("fsync", False), ("fsync", True), ("replace", False)],
    ids=["before-open", "inside-open", "before-fsync", "after-fsync", "before-replace"],
)
def test_an_interrupt_at_any_step_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, name, after):
    """The name is known before the file exists, so even an interrupt inside ``os.open`` finds it."""
    path = tmp_path / "summary.json"
    path.write_text("old")
    monkeypatch.setattr(atomic.os, name, _interrupt(getattr(atomic.os, name), after))
    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write_text(path, "new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"] and path.read_text() == "old"


def test_an_interrupt_while_writing_leaves_no_temp_file(tmp_path):
    def write(handle):
        handle.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic.atomic_write(tmp_path / "a.json", write)
    assert list(tmp_path.iterdir()) == []


def _ctrl_c_in_rmtree(surfaces: str) -> None:
    """A Ctrl-C inside ``shutil.rmtree``: as itself, or (Python < 3.11, seen in CI on 3.10) as the
    ``OSError(EBADF)`` of the ``finally`` that closes a folder a second time, which replaces it."""
    if surfaces == "as itself":
        raise KeyboardInterrupt
    try:
        raise KeyboardInterrupt
    finally:
        raise OSError(9, "Bad file descriptor")


@pytest.mark.parametrize("surfaces", ["as itself", "as a closing error"])
def test_a_second_interrupt_during_cleanup_still_removes_the_temp_folder(tmp_path, monkeypatch, surfaces):
    """The removal finishes, then the interrupt (not the OSError it may surface as) is raised."""
    folder = tmp_path / ".out.0123.tmp"
    (folder / "pairs").mkdir(parents=True)
    (folder / "pairs" / "a.json").write_text("{}")
    real, calls = atomic.shutil.rmtree, []

    def rmtree_interrupted_once(path, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            _ctrl_c_in_rmtree(surfaces)
        real(path, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree_interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        atomic.discard(folder)
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_an_error_of_the_removal_itself_is_not_taken_for_an_interrupt(tmp_path, monkeypatch) -> None:
    (tmp_path / "x").mkdir()
    monkeypatch.setattr(atomic.shutil, "rmtree", lambda path, **kwargs: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        atomic.discard(tmp_path / "x")
