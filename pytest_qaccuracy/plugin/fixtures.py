"""Fixtures and the ``qaccuracy`` marker: pairs, datasets, and the recorder that checks them.

Relative paths (fixture arguments and marker keys) resolve against the test module's folder.
Tolerances resolve, most specific first: ``check()`` arguments, the ``qaccuracy`` marker, the
command line, the ini file, the defaults; each failure message says which one applied.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.schemes import DEFAULT_BACKEND, DEFAULT_SCHEME, RUN_KEYS
from pytest_qaccuracy.plugin.session import CheckResult, QAccuracySession
from pytest_qaccuracy.tolerances import (
    TOLERANCES,
    Rule,
    Tolerance,
    check_tolerance,
    is_tolerance,
    parse_rules,
    slice_rules,
    tolerance_values,
    with_slice_tolerances,
)

session_key = pytest.StashKey[QAccuracySession]()
#: A test's marker keys as :func:`read_marker` validated them at setup.
marker_key = pytest.StashKey[dict[str, Any]]()
#: Usage errors found while collecting (a suite's or a marker's unusable task metric), raised after
#: collection: pytest exits 4 with the first one's line (``suite.raise_usage_errors``).
usage_key = pytest.StashKey[list[str]]()

#: Marker keys besides the tolerances.
PAIR_KEYS = (
    "fp32",
    "quantized",
    "data",
    "labels",
    "name",
    "mapping",
    "metrics",
    "layers",
    "scores",
    "slices",
    "task_metrics",
    "task_targets",
    *RUN_KEYS,
)
#: Pair keys an explicit pair (``qaccuracy.pair(...)``, ``qaccuracy_pair(...)``) takes from the marker.
SHARED_KEYS = ("data", "labels", "backend", "scheme", "targets", "task_metrics", "task_targets")
MARKER_HELP = (
    "qaccuracy(fp32=None, quantized=None, data=None, labels=None, name=None, layers=(), backend=None, "
    "scheme=None, targets=None, task_metrics=(), task_targets=None, **tolerances): "
    "the model pair of a test and its tolerances (" + ", ".join(TOLERANCES) + ", and task-metric ones such as "
    "max_drop:cer via **{...})"
)


def read_marker(item: pytest.Item) -> dict[str, Any]:
    """The test's marker keys, validated once (at setup; kept in ``item.stash[marker_key]``): a
    tolerance as its :class:`Tolerance`, ``backend``/``scheme``/``targets`` as checked (None: the
    ini/command-line value). An unknown key or a bad value raises ValueError naming the key."""
    found: dict[str, Any] = {}
    for key, value in _marker_kwargs(item).items():
        if is_tolerance(key):
            found[key] = Tolerance(key, check_tolerance(key, value), f"marker @pytest.mark.qaccuracy({key}=...)")
        elif key in RUN_KEYS:
            found[key] = None if value is None else RUN_KEYS[key](value)
        elif key in PAIR_KEYS:
            found[key] = value
        else:
            known = ", ".join([*PAIR_KEYS, *TOLERANCES])
            raise ValueError(f"@pytest.mark.qaccuracy: unknown key '{key}' (known: {known})")
    return found


def _marker_kwargs(node: pytest.Item) -> dict[str, Any]:
    """The marker's keys; markers closer to the test win (function over class over module)."""
    merged: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers("qaccuracy"))):
        if mark.args:
            raise ValueError("@pytest.mark.qaccuracy takes keyword arguments only")
        merged.update(mark.kwargs)
    return merged


#: Fixtures that make a test a qaccuracy test (it gets the marker for ``-m`` selection).
PLUGIN_FIXTURES = ("qaccuracy", "qaccuracy_pair", "qaccuracy_dataset")


def mark_item(item: pytest.Item) -> None:
    """Give a test that uses the plugin the ``qaccuracy`` marker, and its marker pair's id as a
    keyword, so ``-m "not qaccuracy"`` and ``-k <pair id>`` select it as they select suite items."""
    if item.get_closest_marker("qaccuracy") is None:
        if not set(getattr(item, "fixturenames", ())) & set(PLUGIN_FIXTURES):
            return
        item.add_marker(pytest.mark.qaccuracy)
    try:
        kwargs = _marker_kwargs(item)
    except ValueError:  # reported when the test runs (pytest_runtest_setup)
        return
    name = kwargs.get("name") or (Path(str(kwargs["quantized"])).stem if kwargs.get("quantized") else None)
    if name:
        item.extra_keyword_matches.add(str(name))
    if kwargs.get("task_metrics"):  # checked at collection, as in the ini file and suites
        try:
            specs = task_specs(kwargs["task_metrics"], item.path.parent)
        except ValueError as exc:  # the session stops after collection: exit 4, one line
            where = f"{item.nodeid}: @pytest.mark.qaccuracy(task_metrics=...)"
            item.config.stash.setdefault(usage_key, []).append(f"{where}: {exc}")
            return
        if session_key in item.config.stash:  # drift rules may name their values
            item.config.stash[session_key].declare_task_metrics(specs)


class PairHandle:
    """A model pair of the session: comparing it runs once and is cached for the session."""

    def __init__(self, spec: PairSpec, state: QAccuracySession) -> None:
        self.spec = spec
        self._state = state

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def result(self) -> Any:
        """The :class:`~pytest_qaccuracy.analysis.results.ComparisonResult` (computed on first use)."""
        return self._state.comparison(self.spec)

    @property
    def models(self) -> Any:
        """The loaded :class:`~pytest_qaccuracy.model.ModelPair`."""
        return self._state.model_pair(self.spec)

    def __repr__(self) -> str:
        return f"PairHandle({self.spec.id!r})"


def _resolve(base: Path, value: str | Path | None) -> Path | None:
    return None if value is None else (base / Path(value)).resolve()


def make_spec(
    base: Path,
    fp32: Any,
    quantized: Any,
    data: Any,
    *,
    backend: str = DEFAULT_BACKEND,
    scheme: str = DEFAULT_SCHEME,
    targets: tuple[str, ...] = (),
    **extra: Any,
) -> PairSpec:
    """A :class:`PairSpec` from user arguments; missing files raise ValueError. ``backend``,
    ``scheme`` and ``targets`` come checked from where they were given (``RUN_KEYS``)."""
    missing = [name for name, value in (("fp32", fp32), ("quantized", quantized), ("data", data)) if value is None]
    if missing:
        raise ValueError(f"a qaccuracy pair needs fp32, quantized and data; missing {', '.join(missing)}")
    paths = {"fp32": _resolve(base, fp32), "quantized": _resolve(base, quantized), "data": _resolve(base, data)}
    labels = _resolve(base, extra.get("labels"))
    for name, path in [*paths.items(), ("labels", labels)]:
        if path is not None and not path.exists():
            raise ValueError(f"qaccuracy pair: {name} not found: {path}")
    task_targets = _resolve(base, extra.get("task_targets"))
    if task_targets is not None and not task_targets.is_file():
        raise ValueError(f"qaccuracy pair: task_targets not found: {task_targets}")
    mapping = tuple(sorted(dict(extra.get("mapping") or {}).items()))
    metrics = tuple(extra.get("metrics") or ())
    name = extra.get("name") or paths["quantized"].stem
    scores = extra.get("scores")
    if scores is not None and not isinstance(scores, str):
        raise ValueError(f"scores: expected an output name, got {scores!r}")
    from pytest_qaccuracy.analysis.slices import check_slices

    slices = tuple(check_slices(extra.get("slices") or {}, check_tolerance).values())
    return PairSpec(
        task_metrics=task_specs(
            [*extra.get("configured_task_metrics", ()), *(extra.get("task_metrics") or ())], folder=base
        ),
        task_targets=task_targets,
        id=str(name),
        fp32=paths["fp32"],
        quantized=paths["quantized"],
        data=paths["data"],
        labels=labels,
        mapping=mapping,
        metrics=metrics,
        backend=backend,
        scheme=scheme,
        targets=targets,
        scores=scores,
        slices=slices,
    )


def task_specs(values: Sequence[Any], folder: Path | None = None) -> tuple[Any, ...]:
    """Task metrics as :class:`~pytest_qaccuracy.metrics.task.TaskSpec`, each imported and created once
    to check it (ValueError naming the metric), duplicates dropped. A module not on ``sys.path`` is
    looked for in ``folder`` (the declaring file's directory)."""
    if isinstance(values, (str, Mapping)):
        values = [values]
    if not values:
        return ()
    from pytest_qaccuracy.metrics.task import TaskSpec, parse_task_specs

    specs = [v if isinstance(v, TaskSpec) else TaskSpec.parse(v) for v in values]
    if folder is not None:
        specs = [s if s.folder else replace(s, folder=str(folder)) for s in specs]
    return parse_task_specs(list(dict.fromkeys(specs)))


def error_text(exc: BaseException, config: pytest.Config) -> str:
    """One line for a pair that could not be checked: ``CheckError`` names the pair, the output or
    layer and the cause; other errors their type. The traceback follows with ``-v`` or ``--tb=long``."""
    import traceback

    from pytest_qaccuracy.errors import CheckError
    from pytest_qaccuracy.report.terminal import escape_control

    line = escape_control(str(exc) if isinstance(exc, CheckError) else f"{type(exc).__name__}: {exc}")
    cause = exc.__cause__
    if cause is None or not (config.get_verbosity() > 0 or config.getoption("tbstyle", "auto") == "long"):
        return line
    return line + "\n\n" + escape_control("".join(traceback.format_exception(cause)).rstrip())


def pair_rules(pair_id: str, lines: Sequence[str], source: str, offset: int) -> list[Rule]:
    """Per-pair layer rules ``<layer glob> <metric><op><value>`` scoped to ``pair_id``."""
    scoped = [f"{glob.escape(pair_id)}::{line.strip()}" for line in lines if line.strip()]
    rules = parse_rules(scoped, source)
    return [replace(r, position=r.position + offset, required=True) for r in rules]


class QAccuracyRecorder:
    """What the ``qaccuracy`` fixture returns: checks pairs and records results for the summary,
    JUnit XML and artifacts."""

    def __init__(self, request: pytest.FixtureRequest, state: QAccuracySession) -> None:
        self._request = request
        self._state = state
        self._marker = request.node.stash[marker_key]
        self._base = request.path.parent
        self.results: list[CheckResult] = []

    def pair(self, fp32: Any = None, quantized: Any = None, data: Any = None, **extra: Any) -> PairHandle:
        """A pair from arguments; with none of fp32/quantized/data, the marker's pair. An explicit
        pair still takes the marker's ``data``, ``labels``, ``backend`` and ``scheme`` when it names
        none; backend and scheme default to ``qaccuracy_backend``/``qaccuracy_scheme``."""
        settings = self._state.settings
        keys: dict[str, Any] = {
            "backend": settings.backend,
            "scheme": settings.scheme,
            "targets": settings.targets,
            "configured_task_metrics": settings.task_metrics,
        }
        if fp32 is None and quantized is None and data is None:
            keys.update({k: v for k, v in self._marker.items() if k in PAIR_KEYS and k != "layers" and v is not None})
        else:
            keys.update({k: self._marker[k] for k in SHARED_KEYS if self._marker.get(k) is not None})
            keys.update({k: v for k, v in (("fp32", fp32), ("quantized", quantized), ("data", data)) if v})
        try:
            keys.update({k: RUN_KEYS[k](v) if k in RUN_KEYS else v for k, v in extra.items() if v is not None})
            spec = make_spec(
                self._base, keys.pop("fp32", None), keys.pop("quantized", None), keys.pop("data", None), **keys
            )
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)
        return PairHandle(spec, self._state)

    def tolerances(self, **overrides: Any) -> dict[str, Tolerance]:
        """The tolerances in effect for this test, each with its source."""
        marked = {name: value for name, value in self._marker.items() if isinstance(value, Tolerance)}
        return {
            **self._state.settings.tolerances,
            **marked,
            **tolerance_values(overrides, lambda name: f"check() argument {name}="),
        }

    def check(self, pair: PairHandle | None = None, *, layers: Sequence[str] = (), **tolerances: Any) -> CheckResult:
        """Check a pair (the marker's by default) against every tolerance and rule in effect.

        Args:
            pair: from ``qaccuracy_pair(...)`` or ``qaccuracy.pair(...)``; the marker's pair if omitted.
            layers: extra layer rules for this pair, ``"<layer glob> <metric><op><value>"``.
            **tolerances: overrides of the named tolerances (``min_cosine=0.999``, ...).

        Raises:
            AssertionError: a check failed; the message starts with what failed and by how much.
        """
        __tracebackhide__ = True
        handle = pair or self.pair()
        settings = self._state.settings
        effective = self.tolerances(**tolerances)
        rules = list(settings.rules)
        rules += pair_rules(handle.id, list(self._marker.get("layers", ())), "marker layers=", len(rules))
        rules += pair_rules(handle.id, list(layers), "check() argument layers=", len(rules))
        rules += slice_rules(handle.id, handle.spec.slices, len(rules))
        from pytest_qaccuracy.errors import QAccuracyError

        effective = with_slice_tolerances(effective, handle.spec.slices)

        try:
            xfail = self._request.node.get_closest_marker("xfail")
            reason = None if xfail is None else str(xfail.kwargs.get("reason") or "xfail")
            result = self._state.check(handle.spec, effective, rules, self._request.node.nodeid, xfail=reason)
        except QAccuracyError as exc:  # bad models, data, unsupported ops: one line, not a traceback
            failure = error_text(exc, self._request.config)
        else:
            failure = None
        if failure is not None:  # outside the except block: no "During handling of ..." chain
            pytest.fail(failure, pytrace=False)
        self.results.append(result)
        if settings.junit_properties:
            self._request.node.user_properties.extend(result.properties)
        if result.message is not None:
            raise AssertionError(result.message)
        return result


@pytest.fixture
def qaccuracy(request: pytest.FixtureRequest) -> QAccuracyRecorder:
    """Check model pairs against tolerances and record the results.

    Example::

        @pytest.mark.qaccuracy(fp32="m.onnx", quantized="m.int8.onnx", data="calib.h5", min_cosine=0.99)
        def test_int8(qaccuracy):
            qaccuracy.check()
    """
    return QAccuracyRecorder(request, request.config.stash[session_key])


@pytest.fixture
def qaccuracy_pair(request: pytest.FixtureRequest) -> Callable[..., PairHandle]:
    """Factory ``qaccuracy_pair(fp32, quantized, data, *, labels=None, name=None, mapping=None,
    metrics=(), backend=None, scheme=None)``.

    The comparison of a pair runs once per session (per xdist worker) and is cached.
    """
    recorder = QAccuracyRecorder(request, request.config.stash[session_key])
    return recorder.pair


@pytest.fixture
def qaccuracy_dataset(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Factory ``qaccuracy_dataset(path=None)``: an opened dataset (the marker's ``data`` by default),
    closed after the test."""
    opened: list[Any] = []
    marker = request.node.stash[marker_key]

    def load(path: str | Path | None = None) -> Any:
        from pytest_qaccuracy.data import load_dataset

        target = path if path is not None else marker.get("data")
        if target is None:
            pytest.fail("qaccuracy_dataset: no path given and no @pytest.mark.qaccuracy(data=...)", pytrace=False)
        dataset = load_dataset(request.path.parent / Path(target))
        opened.append(dataset)
        return dataset

    yield load
    for dataset in opened:
        dataset.close()


@pytest.fixture
def qaccuracy_calibrate(request: pytest.FixtureRequest) -> Callable[..., Path]:
    """Factory ``qaccuracy_calibrate(fp32, data, *, method="auto", nodes_to_exclude=(), **options)``:
    the QDQ model onnxruntime writes from ``fp32`` calibrated on ``data`` (paths relative to the test
    file), made once and kept by content hash in pytest's cache folder (``.pytest_cache``), so later
    sessions reuse it until the model, the data, the options or the versions change.

    ``options`` are :class:`~pytest_qaccuracy.analysis.calibration.CalibrationOptions` fields
    (``activation_type``, ``weight_type``, ``per_channel``, ``power2``, ...). Example::

        def test_auto(qaccuracy, qaccuracy_pair, qaccuracy_calibrate):
            quantized = qaccuracy_calibrate("m.onnx", "calib.npz", method="auto")
            qaccuracy.check(qaccuracy_pair("m.onnx", quantized, "test.npz"), min_cosine=0.99)
    """
    state = request.config.stash[session_key]
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        folder = cache.mkdir("qaccuracy-calibrated")
    else:  # -p no:cacheprovider: kept for this session only
        folder = request.getfixturevalue("tmp_path_factory").getbasetemp() / "qaccuracy-calibrated"

    def make(fp32: Any, data: Any, *, method: str = "auto", nodes_to_exclude: Any = (), **options: Any) -> Path:
        from pytest_qaccuracy.analysis.calibration import CalibrationOptions
        from pytest_qaccuracy.analysis.calibration.cache import calibrated_model
        from pytest_qaccuracy.errors import QAccuracyError

        base = request.path.parent
        try:
            calibration = CalibrationOptions(method=method, **options)
            path, _ = calibrated_model(
                base / Path(fp32), base / Path(data), folder, calibration, state.runtime_options(), nodes_to_exclude
            )
        except (QAccuracyError, TypeError) as exc:  # TypeError: an option CalibrationOptions does not have
            pytest.fail(f"qaccuracy_calibrate: {exc}", pytrace=False)
        return path

    return make
