"""Unit tests of the fixtures and the marker (``plugin/fixtures.py``), in-process with stand-ins for
pytest's items and requests and for the session state: the marker's keys and each refusal's line,
the ``qaccuracy`` marker and keywords given at collection, pair specs from arguments (paths relative
to the test's folder, each missing file named), task metrics, the one-line error of a pair that could
not be checked, per-pair layer rules, what ``check`` passes to the session and how it fails, and the
four fixtures (no model is run: the session's ``check`` and the calibration are stand-ins)."""

from __future__ import annotations

import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import pytest_qaccuracy.data
from pytest_qaccuracy.analysis.calibration import cache as calibration_cache
from pytest_qaccuracy.errors import CheckError, DataError
from pytest_qaccuracy.metrics.task import TaskSpec
from pytest_qaccuracy.plugin.fixtures import (
    PairHandle,
    QAccuracyRecorder,
    error_text,
    make_spec,
    mark_item,
    marker_key,
    pair_rules,
    qaccuracy,
    qaccuracy_calibrate,
    qaccuracy_dataset,
    qaccuracy_pair,
    read_marker,
    session_key,
    task_specs,
    usage_key,
)
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.session import CheckResult
from pytest_qaccuracy.tolerances import Rule, Tolerance
from tests.progress_recorders import record_closes

NOTSET = object()
#: mark_item adds ``pytest.mark.qaccuracy``, which only the plugin registers (the mutation group runs
#: this file with ``-p no:qaccuracy``)
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")


class Config:
    """A pytest config: verbosity, ``--tb`` (NOTSET: not declared, ``-p no:terminal``), the stash, and
    pytest's cache (none with ``-p no:cacheprovider``: the attribute is missing, as in pytest)."""

    def __init__(self, verbosity: int = 0, tbstyle: Any = "auto", cache: Any = None) -> None:
        self.verbosity, self.tbstyle = verbosity, tbstyle
        if cache is not None:
            self.cache = cache
        self.stash = pytest.Stash()

    def get_verbosity(self) -> int:
        return self.verbosity

    def getoption(self, name: str, default: Any = NOTSET) -> Any:
        if name == "tbstyle" and self.tbstyle is not NOTSET:
            return self.tbstyle
        if default is NOTSET:
            raise ValueError(f"no option named {name!r}")
        return default


class Node:
    """A collected test: its markers (closest first, as pytest iterates them), fixtures, keywords,
    stash and JUnit user properties."""

    def __init__(self, *marks: Any, fixturenames: tuple[str, ...] = (), path: Path = Path("/t/test_m.py")) -> None:
        self.marks = [m.mark if hasattr(m, "mark") else m for m in marks]
        self.fixturenames = fixturenames
        self.path = path
        self.nodeid = "test_m.py::test_x"
        self.config = Config()
        self.extra_keyword_matches: set[str] = set()
        self.stash = pytest.Stash()
        self.user_properties: list[tuple[str, Any]] = []

    def iter_markers(self, name: str) -> list[Any]:
        return [m for m in self.marks if m.name == name]

    def get_closest_marker(self, name: str) -> Any:
        found = self.iter_markers(name)
        return found[0] if found else None

    def add_marker(self, marker: Any) -> None:
        self.marks.append(marker.mark)


def mark(*args: Any, **kwargs: Any) -> Any:
    """A ``@pytest.mark.qaccuracy(...)`` as the item holds it (the outer session runs without the plugin,
    which registers the marker)."""
    return pytest.mark.qaccuracy(*args, **kwargs).mark


# --- the marker ---------------------------------------------------------------------------------------


def test_read_marker_validates_each_key() -> None:
    found = read_marker(
        Node(mark(min_cosine=0.99, fp32="m.onnx", backend="integer", scheme=None, targets="glow, power2"))
    )
    assert found == {
        "min_cosine": Tolerance("min_cosine", 0.99, "marker @pytest.mark.qaccuracy(min_cosine=...)"),
        "fp32": "m.onnx",
        "backend": "integer",
        "scheme": None,
        "targets": ("glow", "power2"),
    }
    found = read_marker(Node(mark(**{"max_drop:cer": 0.01}, scheme="tflite", layers=["a min_cosine>=0.5"])))
    assert found == {
        "max_drop:cer": Tolerance("max_drop:cer", 0.01, "marker @pytest.mark.qaccuracy(max_drop:cer=...)"),
        "scheme": "tflite",
        "layers": ["a min_cosine>=0.5"],
    }
    assert read_marker(Node()) == {}


def test_read_marker_refuses_unknown_keys_bad_values_and_positional_arguments() -> None:
    with pytest.raises(ValueError) as info:
        read_marker(Node(mark(fp32="m.onnx", min_cosin=0.9)))
    text = str(info.value)
    assert text.startswith("@pytest.mark.qaccuracy: unknown key 'min_cosin' (known: fp32, quantized, data, labels, ")
    assert "task_targets, backend, scheme, targets, min_cosine, " in text and text.endswith(")")
    with pytest.raises(ValueError, match=r"^backend: unknown backend 'tpu' \(known: onnxruntime, integer\)$"):
        read_marker(Node(mark(backend="tpu")))
    with pytest.raises(ValueError, match=r"^min_cosine: "):
        read_marker(Node(mark(min_cosine="high")))
    with pytest.raises(ValueError, match=r"^@pytest\.mark\.qaccuracy takes keyword arguments only$"):
        read_marker(Node(mark("m.onnx")))


def test_the_closest_marker_wins_key_by_key() -> None:
    node = Node(mark(min_cosine=0.9), mark(min_cosine=0.5, fp32="class.onnx"), mark(fp32="module.onnx", data="d"))
    assert read_marker(node) == {
        "min_cosine": Tolerance("min_cosine", 0.9, "marker @pytest.mark.qaccuracy(min_cosine=...)"),
        "fp32": "class.onnx",
        "data": "d",
    }


# --- mark_item: the marker and keywords at collection ------------------------------------------------


@pytest.mark.parametrize("fixture", ["qaccuracy", "qaccuracy_pair", "qaccuracy_dataset"])
def test_a_test_using_a_plugin_fixture_gets_the_marker(fixture: str) -> None:
    node = Node(fixturenames=("tmp_path", fixture))
    mark_item(node)
    assert node.get_closest_marker("qaccuracy") is not None and node.extra_keyword_matches == set()


def test_other_tests_get_no_marker() -> None:
    node = Node(fixturenames=("tmp_path", "qaccuracy_calibrate", "my_qaccuracy"))
    mark_item(node)
    assert node.marks == [] and node.extra_keyword_matches == set()
    node = Node()
    del node.fixturenames  # an item that is not a Python function (a doctest, another plugin's)
    mark_item(node)
    assert node.marks == [] and node.extra_keyword_matches == set()


def test_a_marked_test_is_selectable_by_its_pair_id() -> None:
    node = Node(mark(quantized="models/m.int8.onnx"), fixturenames=())
    mark_item(node)
    assert node.extra_keyword_matches == {"m.int8"}
    node = Node(mark(name="digits", quantized="models/m.int8.onnx"))
    mark_item(node)
    assert node.extra_keyword_matches == {"digits"}
    node = Node(mark(fp32="m.onnx", min_cosine=0.9))
    mark_item(node)
    assert node.extra_keyword_matches == set()
    node = Node(mark("m.onnx", name="digits"))  # refused when the test runs, not at collection
    mark_item(node)
    assert node.extra_keyword_matches == set()


def test_a_markers_task_metrics_are_checked_at_collection_and_declared(tmp_path: Path) -> None:
    declared: list[Any] = []
    node = Node(mark(task_metrics=["binary_f1"]), path=tmp_path / "test_m.py")
    node.config.stash[session_key] = SimpleNamespace(declare_task_metrics=declared.append)
    mark_item(node)
    assert declared == [(TaskSpec("binary_f1", folder=str(tmp_path)),)]
    assert declared[0][0].folder == str(tmp_path) and usage_key not in node.config.stash
    node = Node(mark(task_metrics="binary_f1"), path=tmp_path / "test_m.py")  # no session state: nothing to declare
    mark_item(node)
    assert usage_key not in node.config.stash


def test_a_markers_unusable_task_metric_is_a_usage_error_line(tmp_path: Path) -> None:
    node = Node(mark(task_metrics=["no_such_module_xyz:Metric"]), path=tmp_path / "test_m.py")
    declared: list[Any] = []
    node.config.stash[session_key] = SimpleNamespace(declare_task_metrics=declared.append)
    node.config.stash[usage_key] = ["an earlier line"]
    mark_item(node)
    errors = node.config.stash[usage_key]
    assert errors[0] == "an earlier line" and len(errors) == 2 and declared == []
    assert errors[1].startswith("test_m.py::test_x: @pytest.mark.qaccuracy(task_metrics=...): ")
    assert "no_such_module_xyz" in errors[1]
    node = Node(mark(task_metrics=[{"options": 1}]), path=tmp_path / "test_m.py")
    mark_item(node)
    assert node.config.stash[usage_key] == [
        "test_m.py::test_x: @pytest.mark.qaccuracy(task_metrics=...): expected 'module:Class' or a table with "
        "'metric' and options, got {'options': 1}"
    ]


# --- pairs ----------------------------------------------------------------------------------------------


def _files(folder: Path, *names: str) -> None:
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def test_make_spec_resolves_paths_against_the_test_folder(tmp_path: Path) -> None:
    base = tmp_path / "tests"
    _files(tmp_path, "models/m.onnx", "models/m.int8.onnx", "data/d.npz", "data/labels.npy", "targets.jsonl")
    spec = make_spec(base, "../models/m.onnx", tmp_path / "models/m.int8.onnx", Path("../data/d.npz"))
    assert spec == PairSpec(
        id="m.int8",
        fp32=tmp_path / "models/m.onnx",
        quantized=tmp_path / "models/m.int8.onnx",
        data=tmp_path / "data/d.npz",
    )
    spec = make_spec(
        base,
        "../models/m.onnx",
        "../models/m.int8.onnx",
        "../data/d.npz",
        backend="integer",
        scheme="glow",
        targets=("tflite",),
        labels="../data/labels.npy",
        task_targets="../targets.jsonl",
        mapping={"z": "b", "a": "y"},
        metrics=["cosine", "sqnr"],
        name=7,
        scores="logits",
        slices={"head": "y[:, :2]"},
    )
    assert (spec.id, spec.labels, spec.task_targets) == ("7", tmp_path / "data/labels.npy", tmp_path / "targets.jsonl")
    assert (spec.mapping, spec.metrics, spec.scores) == ((("a", "y"), ("z", "b")), ("cosine", "sqnr"), "logits")
    assert (spec.backend, spec.scheme, spec.targets) == ("integer", "glow", ("tflite",))
    assert [(s.name, s.view) for s in spec.slices] == [("head", "y[:, :2]")]


def test_make_spec_names_what_is_missing(tmp_path: Path) -> None:
    _files(tmp_path, "m.onnx", "q.onnx", "d.npz")
    with pytest.raises(ValueError, match=r"^a qaccuracy pair needs fp32, quantized and data; missing fp32, data$"):
        make_spec(tmp_path, None, "q.onnx", None)
    with pytest.raises(ValueError, match=r"^a qaccuracy pair needs fp32, quantized and data; missing quantized$"):
        make_spec(tmp_path, "m.onnx", None, "d.npz")
    for args, name in (
        (("x.onnx", "q.onnx", "d.npz"), "fp32"),
        (("m.onnx", "x.onnx", "d.npz"), "quantized"),
        (("m.onnx", "q.onnx", "x.npz"), "data"),
    ):
        with pytest.raises(ValueError) as info:
            make_spec(tmp_path, *args)
        missing = tmp_path / ("x.npz" if name == "data" else "x.onnx")
        assert str(info.value) == f"qaccuracy pair: {name} not found: {missing}"
    with pytest.raises(ValueError) as info:
        make_spec(tmp_path, "m.onnx", "q.onnx", "d.npz", labels="l.npy")
    assert str(info.value) == f"qaccuracy pair: labels not found: {tmp_path / 'l.npy'}"
    for targets in ("t.jsonl", "."):  # missing, or a folder
        with pytest.raises(ValueError) as info:
            make_spec(tmp_path, "m.onnx", "q.onnx", "d.npz", task_targets=targets)
        assert str(info.value) == f"qaccuracy pair: task_targets not found: {(tmp_path / targets).resolve()}"
    with pytest.raises(ValueError, match=r"^scores: expected an output name, got \['y'\]$"):
        make_spec(tmp_path, "m.onnx", "q.onnx", "d.npz", scores=["y"])
    with pytest.raises(ValueError, match=r"^slices\.head: "):
        make_spec(tmp_path, "m.onnx", "q.onnx", "d.npz", slices={"head": "y"})
    with pytest.raises(ValueError, match=r"^slices\.head\.min_cosine: "):
        make_spec(tmp_path, "m.onnx", "q.onnx", "d.npz", slices={"head": {"view": "y[:, 0]", "min_cosine": "x"}})


def test_make_spec_task_metrics_are_the_configured_ones_then_the_pairs(tmp_path: Path) -> None:
    _files(tmp_path, "m.onnx", "q.onnx", "d.npz")
    spec = make_spec(
        tmp_path, "m.onnx", "q.onnx", "d.npz", configured_task_metrics=("binary_f1",), task_metrics=["ctc"]
    )
    assert spec.task_metrics == (TaskSpec("binary_f1"), TaskSpec("ctc"))
    assert [s.folder for s in spec.task_metrics] == [str(tmp_path), str(tmp_path)]
    assert make_spec(tmp_path, "m.onnx", "q.onnx", "d.npz", task_metrics=None).task_metrics == ()


def test_task_specs_take_one_metric_or_a_list_and_drop_duplicates(tmp_path: Path) -> None:
    assert task_specs([]) == () and task_specs(()) == ()
    (spec,) = task_specs("binary_f1")
    assert spec == TaskSpec("binary_f1") and spec.folder == ""
    (spec,) = task_specs({"metric": "ctc", "blank": 0}, folder=tmp_path)
    assert (spec.path, spec.options, spec.folder) == ("ctc", '{"blank": 0}', str(tmp_path))
    own = TaskSpec("ctc", folder="/elsewhere")
    assert [s.folder for s in task_specs([own, "binary_f1", "binary_f1"], folder=tmp_path)] == [
        "/elsewhere",
        str(tmp_path),
    ]
    with pytest.raises(ValueError, match="both compute"):
        task_specs(["ctc", {"metric": "ctc", "blank": 1}])


def test_a_pair_handle_compares_through_the_session() -> None:
    spec = PairSpec(id="p", fp32=Path("/a"), quantized=Path("/b"), data=Path("/c"))
    state = SimpleNamespace(comparison=lambda s: ("compared", s), model_pair=lambda s: ("loaded", s))
    handle = PairHandle(spec, state)
    assert handle.id == "p" and handle.spec is spec
    assert handle.result == ("compared", spec) and handle.models == ("loaded", spec)
    assert repr(handle) == "PairHandle('p')"


# --- the line of a pair that could not be checked ------------------------------------------------------


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        try:
            if cause is not None:
                raise cause
        finally:
            if cause is not None:
                raise exc from cause
            raise exc
    except BaseException as caught:
        return caught


def test_error_text_is_one_line_unless_asked_for_the_cause() -> None:
    exc = _raised(CheckError("pair 'p', output 'y': cannot compare"), ZeroDivisionError("division by zero"))
    assert error_text(exc, Config()) == "pair 'p', output 'y': cannot compare"
    assert error_text(DataError("bad\x1b[31m file"), Config()) == "DataError: bad\\x1b[31m file"
    cause = "".join(traceback.format_exception(exc.__cause__)).rstrip()
    assert "ZeroDivisionError: division by zero" in cause
    for config in (Config(verbosity=1), Config(tbstyle="long")):
        assert error_text(exc, config) == "pair 'p', output 'y': cannot compare\n\n" + cause
    assert error_text(exc, Config(tbstyle="short")) == "pair 'p', output 'y': cannot compare"
    assert error_text(exc, Config(tbstyle=NOTSET)) == "pair 'p', output 'y': cannot compare"  # -p no:terminal
    assert error_text(CheckError("no cause"), Config(verbosity=2)) == "no cause"


def test_error_text_escapes_control_characters_in_the_cause() -> None:
    exc = _raised(CheckError("x"), ValueError("a\x1bb"))
    text = error_text(exc, Config(verbosity=1))
    assert text.endswith("ValueError: a\\x1bb") and "\x1b" not in text


def test_pair_rules_are_scoped_to_the_pair_and_placed_after_the_others() -> None:
    rules = pair_rules("p[1]", ["conv* min_cosine>=0.9", "   ", " fc sqnr>=10 "], "marker layers=", 3)
    assert [(r.pair, r.layer, r.metric, r.op, r.value, r.source, r.position, r.required) for r in rules] == [
        ("p[[]1]", "conv*", "min_cosine", ">=", 0.9, "marker layers=", 3, True),
        ("p[[]1]", "fc", "sqnr", ">=", 10.0, "marker layers=", 4, True),
    ]
    assert pair_rules("p", [], "x", 0) == []


# --- the recorder: pairs, tolerances, check -----------------------------------------------------------


class Session:
    """The plugin's session state as the recorder uses it: settings, and a ``check`` that records its
    call and returns (or raises) what the test says."""

    def __init__(self, **settings: Any) -> None:
        defaults = {
            "backend": "onnxruntime",
            "scheme": "onnxruntime",
            "targets": (),
            "task_metrics": (),
            "tolerances": {"min_cosine": Tolerance("min_cosine", 0.99, "default")},
            "rules": [],
            "junit_properties": True,
        }
        self.settings = SimpleNamespace(**{**defaults, **settings})
        self.calls: list[Any] = []
        self.outcome: Any = None

    def check(self, spec: PairSpec, tolerances: Any, rules: Any, nodeid: str, xfail: str | None = None) -> Any:
        self.calls.append((spec, tolerances, rules, nodeid, xfail))
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome or CheckResult(spec.id, [], None, [("qaccuracy.pair", spec.id)])


def _request(folder: Path, marker: dict[str, Any], *marks: Any) -> Any:
    node = Node(*marks, path=folder / "test_m.py")
    node.stash[marker_key] = marker
    return SimpleNamespace(node=node, path=folder / "test_m.py", config=node.config)


def _project(tmp_path: Path) -> Path:
    _files(tmp_path, "m.onnx", "q.onnx", "r.onnx", "d.npz", "e.npz", "l.npy")
    return tmp_path


def test_the_markers_pair(tmp_path: Path) -> None:
    marker = read_marker(
        Node(
            mark(
                fp32="m.onnx",
                quantized="q.onnx",
                data="d.npz",
                labels=None,
                layers=["a sqnr>=1"],
                scheme="glow",
                backend=None,
                min_cosine=0.5,
            )
        )
    )
    recorder = QAccuracyRecorder(_request(_project(tmp_path), marker), Session(backend="integer"))
    spec = recorder.pair().spec
    assert (spec.id, spec.fp32, spec.quantized, spec.data, spec.labels) == (
        "q",
        tmp_path / "m.onnx",
        tmp_path / "q.onnx",
        tmp_path / "d.npz",
        None,
    )
    assert (spec.backend, spec.scheme, spec.targets) == ("integer", "glow", ())


def test_an_explicit_pair_takes_only_the_shared_keys_of_the_marker(tmp_path: Path) -> None:
    marker = read_marker(
        Node(mark(fp32="m.onnx", quantized="q.onnx", data="d.npz", labels="l.npy", name="marked", backend="integer"))
    )
    session = Session(scheme="tflite", targets=("glow",), task_metrics=("binary_f1",))
    recorder = QAccuracyRecorder(_request(_project(tmp_path), marker), session)
    spec = recorder.pair("m.onnx", "r.onnx").spec
    assert (spec.id, spec.quantized, spec.data, spec.labels) == (
        "r",
        tmp_path / "r.onnx",
        tmp_path / "d.npz",
        tmp_path / "l.npy",
    )
    assert (spec.backend, spec.scheme, spec.targets) == ("integer", "tflite", ("glow",))
    assert spec.task_metrics == (TaskSpec("binary_f1"),)
    spec = recorder.pair("m.onnx", "r.onnx", "e.npz", scheme="power2", labels=None, name="mine").spec
    assert (spec.id, spec.data, spec.labels, spec.scheme) == ("mine", tmp_path / "e.npz", tmp_path / "l.npy", "power2")
    spec = QAccuracyRecorder(_request(tmp_path, {}), Session()).pair("m.onnx", "q.onnx", "d.npz").spec
    assert (spec.labels, spec.backend, spec.scheme) == (None, "onnxruntime", "onnxruntime")


def test_one_file_given_makes_an_explicit_pair(tmp_path: Path) -> None:
    marker = read_marker(Node(mark(fp32="m.onnx", quantized="q.onnx", data="d.npz")))
    recorder = QAccuracyRecorder(_request(_project(tmp_path), marker), Session())
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.pair(quantized="r.onnx")  # the marker's data is shared; its models are not
    assert info.value.msg == "a qaccuracy pair needs fp32, quantized and data; missing fp32"
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.pair(data="e.npz")
    assert info.value.msg == "a qaccuracy pair needs fp32, quantized and data; missing fp32, quantized"


def test_a_bad_pair_fails_the_test_with_one_line(tmp_path: Path) -> None:
    recorder = QAccuracyRecorder(_request(_project(tmp_path), {}), Session())
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.pair()
    assert info.value.msg == "a qaccuracy pair needs fp32, quantized and data; missing fp32, quantized, data"
    assert info.value.pytrace is False
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.pair("m.onnx", "q.onnx", "d.npz", scheme="nope")
    assert info.value.msg.startswith("scheme: unknown scheme 'nope' (presets: onnxruntime, ")
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.pair("m.onnx", "gone.onnx", "d.npz")
    assert info.value.msg == f"qaccuracy pair: quantized not found: {tmp_path / 'gone.onnx'}"


def test_tolerances_most_specific_first_each_with_its_source(tmp_path: Path) -> None:
    marker = read_marker(Node(mark(min_cosine=0.9, max_lsb=2, fp32="m.onnx")))
    session = Session(
        tolerances={
            "min_cosine": Tolerance("min_cosine", 0.99, "default"),
            "min_sqnr": Tolerance("min_sqnr", 20.0, "ini"),
        }
    )
    recorder = QAccuracyRecorder(_request(tmp_path, marker), session)
    assert recorder.tolerances() == {
        "min_cosine": Tolerance("min_cosine", 0.9, "marker @pytest.mark.qaccuracy(min_cosine=...)"),
        "min_sqnr": Tolerance("min_sqnr", 20.0, "ini"),
        "max_lsb": Tolerance("max_lsb", 2, "marker @pytest.mark.qaccuracy(max_lsb=...)"),
    }
    assert recorder.tolerances(min_cosine=0.5)["min_cosine"] == Tolerance(
        "min_cosine", 0.5, "check() argument min_cosine="
    )


def test_check_passes_the_pair_tolerances_and_rules_to_the_session(tmp_path: Path) -> None:
    ini_rule = Rule("*", "x", "sqnr", ">=", 1.0, "* ::x sqnr>=1", "ini", 0)
    marker = read_marker(Node(mark(fp32="m.onnx", quantized="q.onnx", data="d.npz", layers=["conv* min_cosine>=0.9"])))
    session = Session(rules=[ini_rule])
    recorder = QAccuracyRecorder(_request(_project(tmp_path), marker), session)
    pair = recorder.pair(
        "m.onnx", "r.onnx", "d.npz", slices={"head": {"view": "y[:, 0]", "max_lsb": 3, "rules": ["sqnr>=5"]}}
    )
    result = recorder.check(pair, layers=["fc min_sqnr>=2"], min_sqnr=3)
    assert recorder.results == [result] and result.pair_id == "r"
    ((spec, tolerances, rules, nodeid, xfail),) = session.calls
    assert spec is pair.spec and nodeid == "test_m.py::test_x" and xfail is None
    assert tolerances == {
        "min_cosine": Tolerance("min_cosine", 0.99, "default"),
        "min_sqnr": Tolerance("min_sqnr", 3.0, "check() argument min_sqnr="),
        "max_lsb": Tolerance("max_lsb", None, "slice 'head'"),
    }
    assert rules[0] is ini_rule
    assert [(r.pair, r.layer, r.metric, r.source, r.position, r.required, r.output) for r in rules[1:]] == [
        ("r", "conv*", "min_cosine", "marker layers=", 1, True, None),
        ("r", "fc", "min_sqnr", "check() argument layers=", 2, True, None),
        ("r", None, "sqnr", "slice 'head' rules", 1_000_003, False, "head"),
    ]
    assert recorder._request.node.user_properties == [("qaccuracy.pair", "r")]


def test_check_of_the_markers_pair_and_junit_properties_off(tmp_path: Path) -> None:
    marker = read_marker(Node(mark(fp32="m.onnx", quantized="q.onnx", data="d.npz")))
    session = Session(junit_properties=False)
    recorder = QAccuracyRecorder(_request(_project(tmp_path), marker), session)
    assert recorder.check().pair_id == "q"
    assert session.calls[0][0].quantized == tmp_path / "q.onnx" and session.calls[0][2] == []
    assert recorder._request.node.user_properties == []


@pytest.mark.parametrize(("reason", "expected"), [("known drift", "known drift"), ("", "xfail")])
def test_check_passes_the_xfail_reason(reason: str, expected: str, tmp_path: Path) -> None:
    marker = read_marker(Node(mark(fp32="m.onnx", quantized="q.onnx", data="d.npz")))
    session = Session()
    recorder = QAccuracyRecorder(_request(_project(tmp_path), marker, pytest.mark.xfail(reason=reason)), session)
    recorder.check()
    assert session.calls[0][4] == expected


def test_a_failed_check_raises_its_message_and_is_recorded(tmp_path: Path) -> None:
    session = Session()
    recorder = QAccuracyRecorder(_request(_project(tmp_path), {}), session)
    session.outcome = CheckResult("q", [], "min_cosine: 0.5 < 0.99", [("qaccuracy.pair", "q")])
    with pytest.raises(AssertionError) as info:
        recorder.check(recorder.pair("m.onnx", "q.onnx", "d.npz"))
    assert str(info.value) == "min_cosine: 0.5 < 0.99"
    assert recorder.results == [session.outcome]
    assert recorder._request.node.user_properties == [("qaccuracy.pair", "q")]


def test_a_failed_checks_traceback_hides_the_plugins_frame(tmp_path: Path) -> None:
    session = Session()
    recorder = QAccuracyRecorder(_request(_project(tmp_path), {}), session)
    session.outcome = CheckResult("q", [], "min_cosine: 0.5 < 0.99", [])
    pair = recorder.pair("m.onnx", "q.onnx", "d.npz")
    with pytest.raises(AssertionError) as info:
        recorder.check(pair)
    raised = info.traceback[-1]  # the frame that raised: check's own
    assert raised.frame.code.path.name == "fixtures.py"
    assert all(entry.frame.raw is not raised.frame.raw for entry in info.traceback.filter(info))


def test_a_pair_that_cannot_be_checked_fails_with_one_line(tmp_path: Path) -> None:
    session = Session()
    recorder = QAccuracyRecorder(_request(_project(tmp_path), {}), session)
    session.outcome = _raised(CheckError("pair 'q': model does not load"), OSError("truncated"))
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.check(recorder.pair("m.onnx", "q.onnx", "d.npz"))
    assert info.value.msg == "pair 'q': model does not load" and info.value.pytrace is False
    assert info.value.__context__ is None  # raised outside the except block
    assert recorder.results == []
    recorder._request.config.verbosity = 1
    with pytest.raises(pytest.fail.Exception) as info:
        recorder.check(recorder.pair("m.onnx", "q.onnx", "d.npz"))
    assert info.value.msg.startswith("pair 'q': model does not load\n\n") and "OSError: truncated" in info.value.msg
    session.outcome = ValueError("a bug")  # not the plugin's own error: pytest shows it
    with pytest.raises(ValueError, match="a bug"):
        recorder.check(recorder.pair("m.onnx", "q.onnx", "d.npz"))


# --- the fixtures -------------------------------------------------------------------------------------


def _fixture_request(tmp_path: Path, marker: dict[str, Any], state: Any = None) -> Any:
    request = _request(tmp_path, marker)
    request.config.stash[session_key] = state or Session()
    return request


def test_the_qaccuracy_fixtures_check_pairs_of_the_session(tmp_path: Path) -> None:
    session = Session()
    request = _fixture_request(_project(tmp_path), {}, session)
    recorder = qaccuracy.__wrapped__(request)
    assert isinstance(recorder, QAccuracyRecorder)
    recorder.check(recorder.pair("m.onnx", "q.onnx", "d.npz"))
    assert len(session.calls) == 1
    make_pair = qaccuracy_pair.__wrapped__(request)
    handle = make_pair("m.onnx", "r.onnx", "d.npz")
    assert isinstance(handle, PairHandle) and handle.spec.quantized == tmp_path / "r.onnx"
    assert handle._state is session


def _dataset(path: Path) -> Path:
    np.savez(path, x=np.zeros((2, 3), np.float32))
    return path


def test_the_dataset_fixture_opens_datasets_and_closes_them_after_the_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = record_closes(monkeypatch, pytest_qaccuracy.data)
    _dataset(tmp_path / "d.npz")
    (tmp_path / "sub").mkdir()
    _dataset(tmp_path / "sub" / "e.npz")
    fixture = qaccuracy_dataset.__wrapped__(_request(tmp_path, {"data": "d.npz"}))
    load = next(fixture)
    marked, other = load(), load("sub/e.npz")
    assert len(marked) == 2 and len(other) == 2 and marked.keys == ["x"]
    assert closed == []
    with pytest.raises(StopIteration):
        next(fixture)
    assert closed == [tmp_path / "d.npz", tmp_path / "sub" / "e.npz"]


def test_the_dataset_fixture_without_a_path_or_a_marked_one_fails(tmp_path: Path) -> None:
    load = next(qaccuracy_dataset.__wrapped__(_request(tmp_path, {})))
    with pytest.raises(pytest.fail.Exception) as info:
        load()
    assert info.value.msg == "qaccuracy_dataset: no path given and no @pytest.mark.qaccuracy(data=...)"
    assert info.value.pytrace is False
    with pytest.raises(DataError):
        load("missing.npz")


class Calibrations:
    """``calibrated_model`` as the fixture calls it: its arguments, and the model it returns."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error

    def __call__(self, fp32: Any, data: Any, folder: Any, calibration: Any, options: Any, exclude: Any) -> Any:
        self.calls.append((fp32, data, folder, calibration, options, exclude))
        if self.error is not None:
            raise self.error
        return Path(folder) / "model.qdq.onnx", True


class Cache:
    """pytest's cache: the folders it made."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mkdir(self, name: str) -> Path:
        folder = self.root / "d" / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def _calibrate_request(tmp_path: Path, cache: Any = None) -> Any:
    session = Session()
    session.runtime_options = lambda: "runtime options"
    request = _fixture_request(tmp_path, {}, session)
    if cache is not None:
        request.config.cache = cache

    def getfixturevalue(name: str) -> Any:
        if name != "tmp_path_factory":
            raise pytest.FixtureLookupError(name, request)
        return SimpleNamespace(getbasetemp=lambda: tmp_path / "basetemp")

    request.getfixturevalue = getfixturevalue
    return request


def test_the_calibrate_fixture_keeps_models_in_pytests_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calibrations = Calibrations()
    monkeypatch.setattr(calibration_cache, "calibrated_model", calibrations)
    make = qaccuracy_calibrate.__wrapped__(_calibrate_request(tmp_path, Cache(tmp_path / ".pytest_cache")))
    folder = tmp_path / ".pytest_cache" / "d" / "qaccuracy-calibrated"
    assert make("models/m.onnx", "calib.npz") == folder / "model.qdq.onnx"
    fp32, data, where, calibration, options, exclude = calibrations.calls[0]
    assert (fp32, data, where, options, exclude) == (
        tmp_path / "models/m.onnx",
        tmp_path / "calib.npz",
        folder,
        "runtime options",
        (),
    )
    assert calibration.method == "auto"
    make("m.onnx", "calib.npz", method="percentile", nodes_to_exclude=["Conv_0"], per_channel=True)
    _, _, _, calibration, _, exclude = calibrations.calls[1]
    assert (calibration.method, calibration.per_channel, exclude) == ("percentile", True, ["Conv_0"])


def test_without_pytests_cache_calibrated_models_are_kept_for_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calibrations = Calibrations()
    monkeypatch.setattr(calibration_cache, "calibrated_model", calibrations)
    make = qaccuracy_calibrate.__wrapped__(_calibrate_request(tmp_path))
    assert make("m.onnx", "calib.npz") == tmp_path / "basetemp" / "qaccuracy-calibrated" / "model.qdq.onnx"


def test_a_calibration_that_fails_fails_the_test_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibration_cache, "calibrated_model", Calibrations(DataError("calib.npz: no records")))
    make = qaccuracy_calibrate.__wrapped__(_calibrate_request(tmp_path))
    with pytest.raises(pytest.fail.Exception) as info:
        make("m.onnx", "calib.npz")
    assert info.value.msg == "qaccuracy_calibrate: calib.npz: no records" and info.value.pytrace is False
    monkeypatch.setattr(calibration_cache, "calibrated_model", Calibrations())
    with pytest.raises(pytest.fail.Exception) as info:
        make("m.onnx", "calib.npz", no_such_option=1)
    assert info.value.msg.startswith("qaccuracy_calibrate: ") and "no_such_option" in info.value.msg
    monkeypatch.setattr(calibration_cache, "calibrated_model", Calibrations(OSError("disk")))
    with pytest.raises(OSError, match="disk"):
        make("m.onnx", "calib.npz")
