"""Declarative suites: ``qaccuracy_*.toml`` files whose pairs and checks become test items.

::

    [defaults]                      # optional; every key of a pair except quantized and name
    data = "data/test.npz"
    [defaults.tolerances]
    min_cosine = 0.99

    [pairs.int8]                    # one collector per pair, in file order; id "int8" unless name = "..."
    fp32 = "models/m.onnx"          # paths are relative to this file
    quantized = "models/m.int8.onnx"
    labels = "data/labels.npy"      # optional; else the dataset's own labels
    metrics = ["mse", "sqnr"]       # optional: computed besides the configured metrics
    layers = ["conv* sqnr>=20"]     # optional layer rules for this pair
    backend = "integer"             # optional: onnxruntime (default: qaccuracy_backend) or integer
    scheme = "tflite"               # optional: integer scheme preset (default: qaccuracy_scheme)
    targets = ["onnxruntime-avx2", "onnxruntime-vnni"]  # optional: output checks on each (qaccuracy_targets)
    xfail = "why"                   # optional: the pair's items are xfail(strict=True)
    [pairs.int8.tolerances]
    max_top1_drop = 0.005

Item ids are ``<file>::<pair>::<check>`` and every item carries the ``qaccuracy`` marker, so
``-m`` and ``-k <pair id>`` select them; checks come in a fixed order: one per tolerance in effect,
``rules`` when layer/output rules apply, ``drift`` when the baseline folder exists (skipped for a
pair with no baseline yet, failed with ``--qaccuracy-baseline``). A tolerance
``max_backend_steps`` is the agreement gate of the pair's scheme (see :func:`.checks.gate_outcome`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from pytest_qaccuracy.plugin.baselines import compared_dir, missing_reason
from pytest_qaccuracy.plugin.fixtures import PAIR_KEYS as MARKER_PAIR_KEYS
from pytest_qaccuracy.plugin.fixtures import error_text, make_spec, pair_rules, session_key, task_specs, usage_key
from pytest_qaccuracy.plugin.ini import load_toml, toml_decode_error
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.schemes import RUN_KEYS
from pytest_qaccuracy.tolerances import (
    TOLERANCES,
    Rule,
    Tolerance,
    Tolerances,
    is_tolerance,
    slice_rules,
    task_tolerance,
    tolerance_values,
    with_slice_tolerances,
)

SUITE_GLOB = "qaccuracy_*.toml"
#: A suite pair's keys: the marker's pair keys, and its own table of tolerances and its xfail reason.
PAIR_KEYS = (*MARKER_PAIR_KEYS, "tolerances", "xfail")
DEFAULT_KEYS = tuple(k for k in PAIR_KEYS if k not in ("quantized", "name"))
#: Item order within a pair; ``rtol`` covers ``atol`` too.
CHECK_ORDER = (
    "min_cosine",
    "min_sqnr",
    "rtol",
    "max_lsb",
    "min_top1_agreement",
    "max_top1_drop",
    "max_backend_steps",
    "max_saturated",
    "min_channel_steps",
)


class SuiteError(Exception):
    """A malformed suite file; the message is one line naming the file and the key."""


class SuiteUsageError(SuiteError):
    """A suite names a task metric that cannot be used (an import path that does not resolve, a
    class missing a method): a usage error of the whole session (exit 4, one line), as in the ini file."""


#: The key of an xdist worker's output that carries its first usage error to the controller.
USAGE_OUTPUT = "qaccuracy_usage_error"


def raise_usage_errors(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``pytest.UsageError`` with the first usage error found while collecting (a suite's or a
    marker's unusable task metric): pytest exits 4 with its one line, before any test runs. An xdist
    worker, whose usage error pytest-xdist would not turn into exit 4, runs no test and hands the
    line to the controller (:data:`USAGE_OUTPUT`), which prints it and exits 4."""
    found = config.stash.get(usage_key, [])
    if not found:
        return
    output = getattr(config, "workeroutput", None)
    if output is None:
        raise pytest.UsageError(found[0])
    output[USAGE_OUTPUT] = found[0]
    items[:] = []


def is_suite(path: Path) -> bool:
    return fnmatchcase(path.name, SUITE_GLOB)


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        return load_toml(path)
    except toml_decode_error() as exc:
        raise SuiteError(f"{path.name}: not valid TOML: {exc}") from None


def _check_table(where: str, table: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise SuiteError(f"{where}: expected a table, got {type(table).__name__}")
    for key in table:
        if key not in allowed:
            raise SuiteError(f"{where}: unknown key '{key}' (known: {', '.join(allowed)})")
    return table


def _strings(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise SuiteError(f"{where}: expected a list of strings")
    return value


class PairConfig:
    """One pair of a suite, validated."""

    def __init__(
        self,
        file: Path,
        name: str,
        table: dict[str, Any],
        defaults: dict[str, Any],
        start: int,
        run: Mapping[str, Any] | None = None,
    ) -> None:
        where = f"{file.name}: pairs.{name}"
        self.table = name  # the [pairs.<table>] it came from (its id may differ: name = "...")
        written = {**defaults, **table}
        merged = {**(run or {}), **written}
        tolerances = {**defaults.get("tolerances", {}), **table.get("tolerances", {})}
        _check_table(f"{where}.tolerances", tolerances, (*TOLERANCES, *(k for k in tolerances if is_tolerance(k))))
        own = table.get("tolerances", {})

        def source(key: str) -> str:
            return f"{file.name} [{'pairs.' + name if key in own else 'defaults'}.tolerances]"

        try:
            self.tolerances = tolerance_values(tolerances, source)
        except ValueError as exc:
            raise SuiteError(f"{where}.tolerances.{exc}") from None
        for key in ("metrics", "layers"):
            if key in merged:
                _strings(f"{where}.{key}", merged[key])
        if "mapping" in merged and not isinstance(merged["mapping"], dict):
            raise SuiteError(f"{where}.mapping: expected a table of fp32 tensor = quantized tensor")
        xfail = merged.get("xfail")
        if xfail is not None and not isinstance(xfail, str):
            raise SuiteError(f"{where}.xfail: expected a reason string")
        self.xfail = xfail
        for key, check in RUN_KEYS.items():
            if key in written:  # checked once, here; ``run`` holds the options' values, checked when read
                try:
                    merged[key] = check(written[key])
                except ValueError as exc:
                    raise SuiteError(f"{where}.{exc}") from None
        if "task_metrics" in merged:
            try:
                task_specs(merged["task_metrics"], file.parent)
            except ValueError as exc:
                raise SuiteUsageError(f"{where}.task_metrics: {exc}") from None
        try:
            extra = {
                k: merged[k]
                for k in (
                    "labels",
                    "mapping",
                    "metrics",
                    "scores",
                    "slices",
                    "task_metrics",
                    "task_targets",
                    "configured_task_metrics",
                    *RUN_KEYS,
                )
                if k in merged
            }
            self.spec: PairSpec = make_spec(
                file.parent,
                merged.get("fp32"),
                merged.get("quantized"),
                merged.get("data"),
                name=table.get("name", name),
                **extra,
            )
        except ValueError as exc:
            raise SuiteError(f"{where}: {exc}") from None
        try:
            self.rules = pair_rules(self.spec.id, merged.get("layers", []), f"{where}.layers", start)
        except ValueError as exc:
            raise SuiteError(f"{where}.layers: {exc}") from None
        try:
            self.rules += slice_rules(self.spec.id, self.spec.slices, start + len(self.rules))
        except ValueError as exc:
            raise SuiteError(f"{where}.slices: {exc}") from None


def load_suite(path: Path, start: int = 0, run: Mapping[str, Any] | None = None) -> list[PairConfig]:
    """Parse and validate a suite file; :class:`SuiteError` on the first problem. ``run`` holds the
    ``backend``, ``scheme`` and ``targets`` of pairs that set none (the ini/command-line values)."""
    document = _check_table(path.name, _load_toml(path), ("defaults", "pairs"))
    defaults = _check_table(f"{path.name}: defaults", document.get("defaults", {}), DEFAULT_KEYS)
    pairs = document.get("pairs")
    if not isinstance(pairs, dict) or not pairs:
        raise SuiteError(f"{path.name}: no [pairs.<name>] table")
    configs = []
    for name, table in pairs.items():  # TOML tables keep file order: deterministic ids under xdist
        _check_table(f"{path.name}: pairs.{name}", table, PAIR_KEYS)
        configs.append(PairConfig(path, name, table, defaults, start, run))
    return configs


#: Pair id -> ``(suite file, its table name)`` of every suite pair collected so far in this session.
suite_ids_key = pytest.StashKey[dict[str, tuple[Path, str]]]()


def _claim_ids(ids: dict[str, tuple[Path, str]], path: Path, pairs: list[PairConfig], root: Path) -> None:
    """Record each pair's id; an id another suite pair already has is a :class:`SuiteError` naming
    both files (two pairs under one id would merge into one row of ``summary.json`` and the report)."""
    for pair in pairs:
        other = ids.setdefault(pair.spec.id, (path, pair.table))
        if other != (path, pair.table):
            first, second = (_shown(p, root) for p in (other[0], path))
            raise SuiteError(
                f"{second}: pairs.{pair.table}: pair id '{pair.spec.id}' is already defined by {first} "
                f'(pairs.{other[1]}); pair ids must be unique across suites (set name = "..." on one of them)'
            )


def _shown(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def pair_lines(text: str) -> dict[str, int]:
    """0-based line of each ``[pairs.<name>]`` header of a suite's text (tomllib gives no lines);
    a pair defined some other way (an inline table, a dotted key) has none."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines()):
        match = _PAIR_HEADER.match(line)
        if match is not None:
            name = next(g for g in (match["quoted"], match["literal"], match["bare"]) if g is not None)
            found.setdefault(name.replace('\\"', '"').replace("\\\\", "\\"), number)
    return found


_PAIR_HEADER = re.compile(
    r"""^\s*\[\s*pairs\s*\.\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|'(?P<literal>[^']*)'|(?P<bare>[A-Za-z0-9_-]+))\s*\]"""
)


class QAccuracyFile(pytest.File):
    """A ``qaccuracy_*.toml`` suite."""

    def collect(self) -> Iterator[pytest.Collector]:
        state = self.config.stash[session_key]
        try:
            run = {
                "backend": state.settings.backend,
                "scheme": state.settings.scheme,
                "targets": state.settings.targets,
                "configured_task_metrics": state.settings.task_metrics,
            }
            pairs = load_suite(self.path, len(state.settings.rules), run)
            _claim_ids(self.config.stash.setdefault(suite_ids_key, {}), self.path, pairs, self.config.rootpath)
        except SuiteUsageError as exc:  # the session stops after collection (raise_usage_errors)
            self.config.stash.setdefault(usage_key, []).append(str(exc))
            return
        except SuiteError as exc:
            raise self.CollectError(str(exc)) from None
        lines = pair_lines(self.path.read_text(encoding="utf-8", errors="replace"))
        for pair in pairs:
            state.declare_task_metrics(pair.spec.task_metrics)
            yield QAccuracyPair.from_parent(self, name=pair.spec.id, pair=pair, line=lines.get(pair.table, 0))


class QAccuracyPair(pytest.Collector):
    """One pair of a suite; its children are the checks."""

    def __init__(self, *, pair: PairConfig, line: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pair = pair
        #: 0-based line of the pair's ``[pairs.<name>]`` header (pytest shows it 1-based)
        self.line = line

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line, f"qaccuracy: {self.pair.spec.id}"

    def collect(self) -> Iterator[pytest.Item]:
        state = self.config.stash[session_key]
        tolerances = with_slice_tolerances({**state.settings.tolerances, **self.pair.tolerances}, self.pair.spec.slices)
        rules = [*state.settings.rules, *self.pair.rules]
        groups: list[tuple[str, dict[str, Tolerance], list[Rule], bool]] = []
        keep = {k: v for k, v in tolerances.items() if k == "topk"}
        for name in CHECK_ORDER:
            if name == "rtol" and ("rtol" in tolerances or "atol" in tolerances):
                subset = {k: tolerances[k] for k in ("rtol", "atol") if k in tolerances}
                groups.append(("rtol" if "rtol" in tolerances else "atol", {**keep, **subset}, [], False))
            elif name in tolerances:  # rtol, when in effect, took the branch above
                groups.append((name, {**keep, name: tolerances[name]}, [], False))
        for name in tolerances:  # task-metric tolerances (max_drop:cer), in the order they were given
            if task_tolerance(name) is not None:
                groups.append((name, {**keep, name: tolerances[name]}, [], False))
        if any(fnmatchcase(self.pair.spec.id, r.pair) for r in rules):
            groups.append(("rules", dict(keep), rules, False))
        if compared_dir(state.settings) is not None:
            groups.append(("drift", dict(keep), [], True))
        if not groups:
            groups.append(("compare", dict(keep), [], False))
        for name, subset, subset_rules, drift in groups:
            item = QAccuracyCheck.from_parent(
                self,
                name=name,
                spec=self.pair.spec,
                tolerances=subset,
                rules=subset_rules,
                drift=drift,
                measure=tolerances,
                line=self.line,
            )
            item.add_marker(pytest.mark.qaccuracy)  # so -m "not qaccuracy" deselects suites too
            item.extra_keyword_matches.add(self.pair.spec.id)
            if self.pair.xfail is not None:
                item.add_marker(pytest.mark.xfail(reason=self.pair.xfail, strict=True))
            yield item


class QAccuracyCheckFailed(AssertionError):
    """A suite check failed; ``args[0]`` is the full message."""


class QAccuracyCheck(pytest.Item):
    """One check of one suite pair."""

    def __init__(
        self,
        *,
        spec: PairSpec,
        tolerances: Tolerances,
        rules: list[Rule],
        drift: bool,
        measure: Tolerances,
        line: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec, self.tolerances, self.rules, self.drift, self.measure = spec, tolerances, rules, drift, measure
        self.line = line

    def runtest(self) -> None:
        state = self.config.stash[session_key]
        missing = missing_reason(state.settings, self.spec, state.rootpath) if self.drift else None
        if missing is not None:
            pytest.skip(missing)
        xfail = self.get_closest_marker("xfail")
        reason = None if xfail is None else str(xfail.kwargs.get("reason") or "xfail")
        result = state.check(
            self.spec, self.tolerances, self.rules, self.nodeid, drift=self.drift, measure=self.measure, xfail=reason
        )
        if state.settings.junit_properties:
            self.user_properties.extend(result.properties)
        if result.message is not None:
            raise QAccuracyCheckFailed(result.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:  # type: ignore[override]
        if isinstance(excinfo.value, QAccuracyCheckFailed):
            return str(excinfo.value)
        from pytest_qaccuracy.errors import QAccuracyError

        if isinstance(excinfo.value, QAccuracyError):
            return error_text(excinfo.value, self.config)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.line, f"qaccuracy: {self.spec.id}::{self.name}"
