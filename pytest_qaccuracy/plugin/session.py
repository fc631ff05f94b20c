"""Run state of one pytest session: cached comparisons, checked pairs, and what they produced.

One :class:`QAccuracySession` lives in ``config.stash``. Pairs are compared once per process and
cached; each check adds :class:`Outcome` rows to the pair's record. Records are plain builtins, so
an xdist worker hands them to the controller through ``workeroutput``, and only the controller
writes artifacts. Heavy modules are imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_qaccuracy.plugin.backend import DEFAULT_BACKEND, DEFAULT_SCHEME, GATE
from pytest_qaccuracy.plugin.baselines import UPDATE_HINT, baseline_path, compared_dir, shown
from pytest_qaccuracy.plugin.rules import SATURATION, Rule
from pytest_qaccuracy.plugin.sensitivity import analyse_records, merge_entry
from pytest_qaccuracy.plugin.settings import QAccuracySettings
from pytest_qaccuracy.report.artifacts import artifact_stem, comparison_name


@dataclass(frozen=True, slots=True)
class PairSpec:
    """What a pair is made of; paths are absolute."""

    id: str
    fp32: Path
    quantized: Path
    data: Path
    labels: Path | None = None
    mapping: tuple[tuple[str, str], ...] = ()
    metrics: tuple[str, ...] = ()
    backend: str = DEFAULT_BACKEND
    scheme: str = DEFAULT_SCHEME
    #: deployment targets (scheme presets) whose output checks run besides the pair's own run
    targets: tuple[str, ...] = ()
    #: the output top-k counts (``"logits"`` or ``"logits:1"``); None: every (records, classes) output
    scores: str | None = None
    #: named views of outputs, each a :class:`~pytest_qaccuracy.analysis.slices.SliceSpec`
    slices: tuple[Any, ...] = ()

    def key(self, root: Path) -> str:
        """A stable identity across runs and machines: the id, the paths relative to ``root``, and the
        backend and scheme when not the defaults (so existing keys, stems and baselines stay valid)."""
        parts = [self.id, *(_relative(p, root) for p in (self.fp32, self.quantized, self.data, self.labels) if p)]
        for name, value, default in (
            ("backend", self.backend, DEFAULT_BACKEND),
            ("scheme", self.scheme, DEFAULT_SCHEME),
        ):
            if value != default:
                parts.append(f"{name}={value}")
        return "|".join(parts)

    def on_target(self, target: str) -> tuple[PairSpec, str]:
        """The pair as it runs on ``target`` (a scheme preset), and the target's resolved name.

        This machine's own target runs on onnxruntime itself (when the pair runs there); any other
        on the integer backend with that preset.
        """
        from pytest_qaccuracy.backend.host import host_preset
        from pytest_qaccuracy.backend.scheme import get_scheme

        name = get_scheme(target).name
        if name == host_preset() and self.backend == "onnxruntime":
            return replace(self, targets=(), scheme=DEFAULT_SCHEME), name
        return replace(self, targets=(), backend="integer", scheme=name), name

    @property
    def compare_scheme(self) -> str | None:
        """The scheme the comparison runs with: the pair's on the integer backend, none on onnxruntime."""
        return self.scheme if self.backend == "integer" else None


def _merge_targets(known: dict[str, Any], new: Mapping[str, Mapping[str, Any]]) -> None:
    """Fold one check's deployment targets into a record's: a target passes only if all its checks did
    (a suite checks one tolerance per item; xdist workers check different items)."""
    for name, entry in new.items():
        passed = bool(entry["passed"]) and bool(known.get(name, {}).get("passed", True))
        known[name] = {**entry, "passed": passed}


def _target_properties(targets: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """JUnit properties of each deployment target: ``qaccuracy.target.<name>.<output>.<metric>``."""
    props = []
    for name, entry in targets.items():
        props.append((f"qaccuracy.target.{name}.passed", str(entry["passed"]).lower()))
        for output, metrics in entry["outputs"].items():
            for metric in ("cosine", "sqnr"):
                if metrics.get(metric) is not None:
                    props.append((f"qaccuracy.target.{name}.{output}.{metric}", f"{float(metrics[metric]):.6g}"))
    return props


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What one ``check`` produced: every outcome, the failure message (None if all passed)."""

    pair_id: str
    outcomes: list[Any]
    message: str | None
    properties: list[tuple[str, str]]

    @property
    def passed(self) -> bool:
        return self.message is None


class QAccuracySession:
    """Caches and records of one pytest process (controller, worker, or a run without xdist)."""

    def __init__(self, settings: QAccuracySettings, rootpath: Path, worker: bool) -> None:
        self.settings = settings
        self.rootpath = rootpath
        self.worker = worker
        self.records: dict[str, dict[str, Any]] = {}
        self.workers_without_data = 0
        self.errors: list[str] = []
        self._pairs: dict[PairSpec, Any] = {}
        self._comparisons: dict[tuple[PairSpec, tuple[str, ...]], Any] = {}
        self._stats: dict[tuple[Any, ...], Any] = {}
        self._agreements: dict[tuple[Path, Path, str], Any] = {}
        self._saturation: dict[tuple[Path, Path], Any] = {}
        self.written: list[Path] = []
        self.status: Any = None  # SessionStatus: whether the session is complete, set before finish()
        self.baselines: Any = None  # BaselineStatus, set by finish() when baselines were compared or written

    def header(self) -> str:
        """One line for ``pytest -v``'s header: the tolerances in effect and where artifacts go."""
        tolerances = ", ".join(f"{name}={value:g}" for name, (value, _) in sorted(self.settings.tolerances.items()))
        artifacts = self.settings.artifacts_dir or "off"
        return f"qaccuracy: {tolerances}; rules: {len(self.settings.rules)}; artifacts: {artifacts}"

    # -- running -------------------------------------------------------------------------------
    def model_pair(self, spec: PairSpec) -> Any:
        from pytest_qaccuracy.model import ModelPair

        if spec not in self._pairs:
            self._pairs[spec] = ModelPair(spec.fp32, spec.quantized, dict(spec.mapping) or None)
        return self._pairs[spec]

    def runtime_options(self) -> Any:
        """onnxruntime options; a provider onnxruntime lacks is an error (it would fall back to CPU)."""
        import onnxruntime

        from pytest_qaccuracy.errors import InputError
        from pytest_qaccuracy.runtime import RuntimeOptions

        available = onnxruntime.get_available_providers()
        missing = [p for p in self.settings.providers if p not in available]
        if missing:
            raise InputError(
                f"qaccuracy_providers: {', '.join(missing)} not available (available: {', '.join(available)})"
            )
        return RuntimeOptions(providers=self.settings.providers, batch_size=self.settings.batch_size)

    def metric_names(self, spec: PairSpec, rules: Sequence[Rule] = ()) -> tuple[str, ...]:
        """Configured metrics (all registered by default) plus what tolerances and rules need."""
        from pytest_qaccuracy.metrics import parse_metric_names

        base = parse_metric_names(list(self.settings.metrics) if self.settings.metrics else None)
        needed = ["cosine", "sqnr", "lsb", *spec.metrics, *(r.metric for r in rules)]
        return tuple(parse_metric_names(list(dict.fromkeys([*base, *needed]))))

    def compared(
        self, spec: PairSpec, rules: Sequence[Rule], tolerances: Mapping[str, tuple[float, str]]
    ) -> tuple[Any, Any]:
        """:meth:`comparison` and :meth:`output_stats`; when neither is known yet, both come from one
        pass over the data, each model running once (issue 14; the figures are identical)."""
        from pytest_qaccuracy.analysis.outputs import OutputMeasure
        from pytest_qaccuracy.errors import CheckError

        names = self.metric_names(spec, rules)
        stats_key, ks, rtol, atol = self._stats_key(spec, tolerances)
        if (spec, names) not in self._comparisons and stats_key not in self._stats:
            measure = OutputMeasure(ks, self._labels(spec), rtol, atol, spec.scores, spec.slices)
            try:
                self._comparisons[(spec, names)] = self._compare(spec, names, measure)
                self._stats[stats_key] = measure.result()
            except CheckError:  # as in two passes: the comparison is recorded, then the statistics raise
                pass
        return self.comparison(spec, rules), self.output_stats(spec, tolerances)

    def comparison(self, spec: PairSpec, rules: Sequence[Rule] = ()) -> Any:
        """The pair's :class:`ComparisonResult`, computed once per process."""
        names = self.metric_names(spec, rules)
        if (spec, names) not in self._comparisons:
            self._comparisons[(spec, names)] = self._compare(spec, names)
        return self._comparisons[(spec, names)]

    def _compare(self, spec: PairSpec, names: tuple[str, ...], measure: Any = None) -> Any:
        from pytest_qaccuracy.analysis.compare import compare

        return compare(
            self.model_pair(spec),
            spec.data,
            list(names),
            self.runtime_options(),
            backend=spec.backend,
            scheme=spec.compare_scheme,
            slices=spec.slices,
            measure=measure,
        )

    @staticmethod
    def _stats_key(spec: PairSpec, tolerances: Mapping[str, tuple[float, str]]) -> tuple[Any, list[int], Any, Any]:
        """The output statistics' cache key (pair, k, rtol, atol), their ks, rtol and atol."""
        k = int(tolerances.get("topk", (1, ""))[0])
        rtol = tolerances["rtol"][0] if "rtol" in tolerances else None
        atol = tolerances["atol"][0] if "atol" in tolerances else None
        return (spec, k, rtol, atol), sorted({1, k}), rtol, atol

    @staticmethod
    def _labels(spec: PairSpec) -> Any:
        import numpy as np

        return np.load(spec.labels, allow_pickle=False) if spec.labels else None

    def output_stats(self, spec: PairSpec, tolerances: Mapping[str, tuple[float, str]]) -> Any:
        """Top-k counts and element checks of the outputs, computed once per (pair, k, rtol, atol)."""
        from pytest_qaccuracy.analysis.outputs import measure_outputs

        key, ks, rtol, atol = self._stats_key(spec, tolerances)
        if key not in self._stats:
            pair, options = self.model_pair(spec), self.runtime_options()
            backend, scheme = spec.backend, spec.compare_scheme
            self._stats[key] = measure_outputs(
                pair, spec.data, ks, self._labels(spec), rtol, atol, options, backend, scheme, spec.scores, spec.slices
            )
        return self._stats[key]

    def agreement(self, spec: PairSpec, max_steps: int) -> Any:
        """The pair's :class:`AgreementResult` (its scheme vs onnxruntime over its dataset) judged
        against ``max_steps``; measured once per process per (quantized model, data, scheme)."""
        from pytest_qaccuracy.backend.agreement import dataset_agreement

        key = (spec.quantized, spec.data, spec.scheme)
        if key not in self._agreements:
            batch_size = self.settings.batch_size
            self._agreements[key] = dataset_agreement(
                spec.quantized, spec.data, scheme=spec.scheme, batch_size=batch_size
            )
        return self._agreements[key].with_max_steps(max_steps)

    def saturation(self, spec: PairSpec) -> Any:
        """The pair's :class:`SaturationReport` (its quantized model on ``onnxruntime-avx2`` against
        exact sums), measured once per process per (quantized model, data)."""
        from pytest_qaccuracy.analysis.saturation import measure_saturation

        key = (spec.quantized, spec.data)
        if key not in self._saturation:
            self._saturation[key] = measure_saturation(spec.quantized, spec.data, batch_size=self.settings.batch_size)
        return self._saturation[key]

    def check(
        self,
        spec: PairSpec,
        tolerances: Mapping[str, tuple[float, str]],
        rules: Sequence[Rule],
        nodeid: str,
        drift: bool = True,
        measure: Mapping[str, tuple[float, str]] | None = None,
        xfail: str | None = None,
    ) -> CheckResult:
        """Evaluate ``tolerances`` and ``rules`` (and baseline drift) on a pair; record the outcome.

        ``measure`` are the tolerances the output statistics are measured for (default
        ``tolerances``): a suite's items check one tolerance each but share one measurement.
        ``xfail`` is the reason when the test is expected to fail (shown in the summary).

        Raises:
            QAccuracyError: bad models, data or options. Any other exception becomes a
                :class:`~pytest_qaccuracy.errors.CheckError` whose one line names the pair, the output
                or layer where known, and the cause; it is recorded as the pair's failed ``error`` check.
        """
        from pytest_qaccuracy.errors import CheckError, QAccuracyError

        try:
            return self._check(spec, tolerances, rules, nodeid, drift, measure, xfail)
        except Exception as exc:
            if isinstance(exc, QAccuracyError) and not isinstance(exc, CheckError):
                raise
            checking = isinstance(exc, CheckError)  # already names the output or layer
            cause = exc.__cause__ if checking else exc
            text = (str(exc) if checking else f"{type(exc).__name__}: {exc}").strip().splitlines() or [""]
            line = f"pair '{spec.id}': {text[0]}"
            self._record_error(spec, line, nodeid, xfail)
            raise CheckError(line) from cause

    def _record_error(self, spec: PairSpec, line: str, nodeid: str, xfail: str | None) -> None:
        """The pair's record (an empty comparison when none ran) with a failed ``error`` check."""
        from pytest_qaccuracy.analysis.results import ComparisonResult
        from pytest_qaccuracy.plugin.checks import Outcome

        key = spec.key(self.rootpath)
        known = [r for (s, _), r in self._comparisons.items() if s == spec]
        result = (
            known[0] if known else ComparisonResult(spec.fp32.name, spec.quantized.name, spec.data.name, 0, {}, [], [])
        )
        outcome = Outcome("error", f"pair '{spec.id}'", "error", "", None, None, False, "exception", line)
        self._record(spec, key, artifact_stem(spec.id, key), result, None, [outcome], nodeid, xfail)

    def _check(
        self,
        spec: PairSpec,
        tolerances: Mapping[str, tuple[float, str]],
        rules: Sequence[Rule],
        nodeid: str,
        drift: bool,
        measure: Mapping[str, tuple[float, str]] | None,
        xfail: str | None,
    ) -> CheckResult:
        from pytest_qaccuracy.plugin.backend import agreement_record, gate_notes, gate_outcome, gate_properties
        from pytest_qaccuracy.plugin.checks import (
            deployment_target,
            evaluate,
            failure_message,
            saturation_notes,
            saturation_outcome,
        )

        result, stats = self.compared(spec, rules, measure or tolerances)
        outcomes = evaluate(result, stats, tolerances, rules, spec.id, spec.slices)
        extra: list[str] = []
        folder = compared_dir(self.settings) if drift else None
        if folder is not None:
            drift_rows, extra = self.drift(spec, result, folder)
            outcomes += drift_rows
        targets, runs = self._targets(spec, tolerances, rules, measure)
        for entry in targets.values():
            outcomes += entry.pop("outcomes")
        if SATURATION in tolerances:
            saturation = self.saturation(spec)
            outcomes.append(saturation_outcome(saturation, *tolerances[SATURATION]))
            if not outcomes[-1].passed:
                extra += saturation_notes(saturation)
        agreement = None
        if GATE in tolerances:
            agreement = self.agreement(spec, int(tolerances[GATE][0]))
            outcomes.append(gate_outcome(agreement, tolerances[GATE][1]))
            extra += gate_notes(agreement)
        key = spec.key(self.rootpath)
        stem = artifact_stem(spec.id, key)
        failed = [o for o in outcomes if not o.passed]
        message = None
        if failed:
            if self.settings.artifacts_dir is not None:
                extra = [*extra, f"Artifacts: {self.settings.artifacts_dir / 'pairs' / comparison_name(stem)}"]
            gate_first = failed[0].check in (GATE, SATURATION)  # worst records and layers say nothing there
            # a failure on a deployment target shows that target's records, elements and layers
            shown, shown_stats = runs.get(deployment_target(failed[0].target) or "", (result, stats))
            message = failure_message(spec.id, failed, None if gate_first else shown, shown_stats, extra)
        self._record(spec, key, stem, result, stats, outcomes, nodeid, xfail)
        if agreement is not None:
            self.records[key]["agreement"] = agreement_record(agreement)
        if targets:
            _merge_targets(self.records[key].setdefault("targets", {}), targets)
        properties = self._properties(spec, result, stats, not failed)
        properties += _target_properties(targets)
        properties += gate_properties(agreement) if agreement is not None else []
        return CheckResult(spec.id, outcomes, message, properties)

    def _targets(
        self,
        spec: PairSpec,
        tolerances: Mapping[str, tuple[float, str]],
        rules: Sequence[Rule],
        measure: Mapping[str, tuple[float, str]] | None,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[Any, Any]]]:
        """Per deployment target: its output figures and its output checks (``outcomes``, labelled
        ``... on <target>``), and its ``(ComparisonResult, OutputStats)``. A target that is the pair's
        own run shows its figures and adds no checks."""
        from pytest_qaccuracy.plugin.checks import ON_TARGET, Outcome, evaluate

        found: dict[str, dict[str, Any]] = {}
        runs: dict[str, tuple[Any, Any]] = {}
        for target in spec.targets:
            run, name = spec.on_target(target)
            result, stats = self.compared(run, rules, measure or tolerances)
            own = (run.backend, run.compare_scheme) == (spec.backend, spec.compare_scheme)
            evaluated = evaluate(result, stats, tolerances, rules, spec.id, spec.slices)
            checked = [o for o in evaluated if o.target.startswith("output")]
            # the pair's own run: its checks are the pair's, not repeated; its verdict is theirs
            rows = [
                Outcome(**{**o.to_dict(), "target": o.target + ON_TARGET + name, "detail": o.detail + ON_TARGET + name})
                for o in ([] if own else checked)
            ]
            found[name] = {
                "backend": run.backend,
                "scheme": name,
                "outputs": {o.name: dict(o.metrics) for o in result.outputs},
                "topk": dict(stats.topk) if stats is not None else {},
                "passed": all(o.passed for o in checked),
                "outcomes": rows,
            }
            runs[name] = (result, stats)
        return found, runs

    def drift(self, spec: PairSpec, result: Any, directory: Path) -> tuple[list[Any], list[str]]:
        """Drift outcomes against the baseline saved in ``directory``, and notes (missing layers)."""
        from pytest_qaccuracy.plugin.checks import Outcome
        from pytest_qaccuracy.report.baseline import DEFAULT_DRIFT, find_drift, load_baseline, parse_drift_rule

        path = baseline_path(directory, spec, self.rootpath)
        source = "--qaccuracy-baseline" if self.settings.baseline_required else f"baseline {shown(path, self.rootpath)}"
        try:
            document = load_baseline(path)
        except ValueError as exc:  # includes JSON syntax errors
            detail = f"unreadable baseline {path}: {exc}"
            return [Outcome("drift", "baseline", "baseline", "", None, None, False, source, detail)], []
        if document is None:
            if not self.settings.baseline_required:  # compared automatically: a new pair has none yet
                return [], []
            detail = f"no baseline for pair '{spec.id}' in {directory} ({UPDATE_HINT})"
            return [Outcome("drift", "baseline", "baseline", "", None, None, False, source, detail)], []
        try:
            rules = [parse_drift_rule(t, result.higher_is_better) for t in self.settings.max_drift or DEFAULT_DRIFT]
        except ValueError as exc:
            return [Outcome("drift", "baseline", "drift rule", "", None, None, False, source, str(exc))], []
        drifts, missing = find_drift(document, result, rules)
        rows = [
            Outcome("drift", d.target, d.metric, "drift", d.allowed, d.current, False, source, f"drift: {d.describe()}")
            for d in drifts
        ]
        if not rows:
            ok = f"no drift beyond {', '.join(r.text for r in rules)}"
            rows = [Outcome("drift", "baseline", "drift", "drift", None, None, True, source, ok)]
        notes = [f"Not in this run (in the baseline): {', '.join(missing[:10])}"] if missing else []
        if drifts:
            notes.append("To accept these numbers as the new baseline: --qaccuracy-update-all-baselines")
        return rows, notes

    def _properties(self, spec: PairSpec, result: Any, stats: Any, passed: bool) -> list[tuple[str, str]]:
        """JUnit properties: plain strings, never numpy scalars."""
        from pytest_qaccuracy.backend.host import host_preset

        props = [("qaccuracy.pair", spec.id), ("qaccuracy.passed", str(passed).lower())]
        # where the quantized model ran: the integer backend's preset, or this machine's onnxruntime
        props += [("qaccuracy.backend", spec.backend), ("qaccuracy.scheme", result.scheme or host_preset())]
        for output in result.outputs:
            for metric in ("cosine", "sqnr", "lsb"):
                value = output.metrics.get(metric)
                if value is not None:
                    props.append((f"qaccuracy.{output.name}.{metric}", f"{float(value):.6g}"))
            counts = stats.topk.get(output.name) if stats is not None else None
            for k, row in (counts or {}).get("k", {}).items():
                for name in ("agreement", "accuracy_drop"):
                    if row.get(name) is not None:
                        props.append((f"qaccuracy.{output.name}.top{k}_{name}", f"{float(row[name]):.6g}"))
        return props

    def _record(
        self,
        spec: PairSpec,
        key: str,
        stem: str,
        result: Any,
        stats: Any,
        outcomes: Sequence[Any],
        nodeid: str,
        xfail: str | None,
    ) -> None:
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = {
                "id": spec.id,
                "key": key,
                "stem": stem,
                "fp32": str(spec.fp32),
                "quantized": str(spec.quantized),
                "data": str(spec.data),
                "labels": str(spec.labels) if spec.labels else None,
                "backend": spec.backend,
                "scheme": result.scheme or spec.scheme,  # the integer backend's preset, resolved
                "comparison": result.to_dict(),
                "topk": {},
                "checks": [],
            }
        if stats is not None:
            record["topk"].update(stats.topk)
        for index, outcome in enumerate(outcomes):
            record["checks"].append({"test": nodeid, "index": index, **outcome.to_dict(), "xfail": xfail})

    def analyse(self) -> None:
        """Sensitivity of the pairs the settings select, into their records (:mod:`.sensitivity`)."""
        analyse_records(self, {spec.key(self.rootpath): spec for spec in self._pairs})

    # -- xdist ---------------------------------------------------------------------------------
    def payload(self) -> dict[str, Any]:
        """Everything a worker sends the controller: builtins only."""
        return {"records": self.records}

    def merge(self, payload: Mapping[str, Any] | None) -> None:
        if not payload:
            self.workers_without_data += 1
            return
        for key, record in payload.get("records", {}).items():
            mine = self.records.get(key)
            if mine is None:
                self.records[key] = record
                continue
            mine["topk"].update(record["topk"])
            merge_entry(mine, record)
            if record.get("agreement") and not mine.get("agreement"):
                mine["agreement"] = record["agreement"]
            if record.get("targets"):
                _merge_targets(mine.setdefault("targets", {}), record["targets"])
            seen = {(c["test"], c["index"]) for c in mine["checks"]}
            mine["checks"].extend(c for c in record["checks"] if (c["test"], c["index"]) not in seen)

    def sorted_records(self) -> list[dict[str, Any]]:
        """Records in a stable order, checks sorted by test and position (same with or without xdist)."""
        records = sorted(self.records.values(), key=lambda r: (r["id"], r["key"]))
        for record in records:
            record["checks"].sort(key=lambda c: (c["test"], c["index"]))
        return records

    # -- end of session (controller only) ------------------------------------------------------
    def finish(self) -> bool:
        """Write artifacts and baselines; called once, on the controller. False if a write failed
        (the reason is in ``errors``, for the terminal summary)."""
        from pytest_qaccuracy.errors import QAccuracyError
        from pytest_qaccuracy.plugin.artifacts import publish_artifacts, write_report
        from pytest_qaccuracy.plugin.baselines import finish_baselines

        records = self.sorted_records()
        if not records:
            return True
        try:  # baselines first: they are committed, and must not depend on the report writers
            self.baselines, written = finish_baselines(self.settings, records, self.rootpath)
            self.written += written
            if self.settings.artifacts_dir is not None:
                report = self.settings.report
                folder, root = self.settings.artifacts_dir, self.rootpath
                self.written += publish_artifacts(folder, records, root, report, self.status)
            elif self.settings.report is not None:  # --qaccuracy-no-artifacts, but a report asked for
                self.written.append(write_report(self.settings.report, records, status=self.status))
        except (OSError, ValueError, QAccuracyError) as exc:
            self.errors.append(f"could not write qaccuracy artifacts: {type(exc).__name__}: {exc}")
            return False
        return True


__all__ = ["CheckResult", "PairSpec", "QAccuracySession"]
