"""Run state of one pytest session: cached comparisons, checked pairs, and what they produced.

One :class:`QAccuracySession` lives in ``config.stash``. Pairs are compared once per process and
cached; each check adds :class:`~pytest_qaccuracy.plugin.records.RecordedCheck` rows to the pair's
:class:`~pytest_qaccuracy.plugin.records.PairRecord`. An xdist worker hands its records to the
controller as a :class:`~pytest_qaccuracy.plugin.records.WorkerPayload` (plain builtins on the
wire), and only the controller writes artifacts. Heavy modules are imported on first use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_qaccuracy.outcomes import XPASS_STRICT
from pytest_qaccuracy.plugin.baselines import IMPROVED, UPDATE_HINT, baseline_path, compared_dir, pair_files, shown
from pytest_qaccuracy.plugin.pairs import PairSpec
from pytest_qaccuracy.plugin.properties import (
    Properties,
    check_properties,
    gate_properties,
    pair_properties,
    target_properties,
)
from pytest_qaccuracy.plugin.records import (
    Outcome,
    PairRecord,
    RecordedCheck,
    TargetRun,
    WorkerPayload,
    agreement_record,
    merge_targets,
)
from pytest_qaccuracy.plugin.sensitivity import analyse_records, merge_entry
from pytest_qaccuracy.plugin.settings import QAccuracySettings
from pytest_qaccuracy.report.artifacts import comparison_name
from pytest_qaccuracy.tolerances import GATE, SATURATION, Rule, Tolerances

if TYPE_CHECKING:
    import numpy as np

    from pytest_qaccuracy.analysis.agreement_pass import AgreementPass
    from pytest_qaccuracy.analysis.outputs import OutputMeasure, OutputStats, TaskValue
    from pytest_qaccuracy.analysis.reference_cache import ReferenceBudget, ReferenceCache
    from pytest_qaccuracy.analysis.results import ComparisonResult
    from pytest_qaccuracy.analysis.saturation import SaturationReport
    from pytest_qaccuracy.backend.agreement import AgreementResult
    from pytest_qaccuracy.model import ModelPair
    from pytest_qaccuracy.report.baseline import BaselineStatus, Drift
    from pytest_qaccuracy.report.completeness import SessionStatus
    from pytest_qaccuracy.runtime import RuntimeOptions

#: The output statistics' cache key: (pair, k, rtol, atol).
StatsKey = tuple[PairSpec, int, float | None, float | None]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What one ``check`` produced: every outcome, the failure message (None if all passed)."""

    pair_id: str
    outcomes: list[Outcome]
    message: str | None
    properties: Properties

    @property
    def passed(self) -> bool:
        return self.message is None


class QAccuracySession:
    """Caches and records of one pytest process (controller, worker, or a run without xdist)."""

    def __init__(self, settings: QAccuracySettings, rootpath: Path, worker: bool) -> None:
        self.settings = settings
        self.rootpath = rootpath
        self.worker = worker
        #: record key (:meth:`PairSpec.key`) -> the pair's record; records are replaced, never changed
        self.records: dict[str, PairRecord] = {}
        #: nodeid -> pytest's outcome of the test and its xfail reason (:meth:`record_report`)
        self.test_outcomes: dict[str, tuple[str, str | None]] = {}
        self.workers_without_data = 0
        self.errors: list[str] = []
        #: the first usage error an xdist worker found while collecting (the controller exits 4 with it)
        self.usage_error: str | None = None
        #: task values some pair of the session computes (ini, suites, markers, pairs measured): a drift
        #: rule naming one of them is another pair's, a rule naming none of them is misspelt
        self.task_values_declared: set[str] = set()
        self._pairs: dict[PairSpec, ModelPair] = {}
        self._comparisons: dict[tuple[PairSpec, tuple[str, ...]], ComparisonResult] = {}
        self._stats: dict[StatsKey, OutputStats] = {}
        self._agreements: dict[tuple[Path, Path, str], AgreementResult] = {}
        self._saturation: dict[tuple[Path, Path, str], SaturationReport] = {}
        self._task_values: dict[PairSpec, dict[str, TaskValue]] = {}
        #: (fp32 model, data) -> its fp32 outputs from the comparison pass, for the sensitivity analysis
        self._references: dict[tuple[Path, Path], ReferenceCache] = {}
        self._check_seconds: dict[tuple[Path, Path, Path], float] = {}
        self._reference_budget: ReferenceBudget | None = None
        self.written: list[Path] = []
        #: whether the session is complete, set on the controller before :meth:`finish`
        self.status: SessionStatus | None = None
        #: set by :meth:`finish` when baselines were compared or written
        self.baselines: BaselineStatus | None = None

    def header(self) -> str:
        """One line for ``pytest -v``'s header: the tolerances in effect and where artifacts go."""
        shown = sorted(self.settings.tolerances.values(), key=lambda t: t.name)
        tolerances = ", ".join(f"{t.name}={t.value:g}" for t in shown if t.value is not None)
        artifacts = self.settings.artifacts_dir or "off"
        return f"qaccuracy: {tolerances}; rules: {len(self.settings.rules)}; artifacts: {artifacts}"

    # -- running -------------------------------------------------------------------------------
    def model_pair(self, spec: PairSpec) -> ModelPair:
        from pytest_qaccuracy.model import ModelPair

        if spec not in self._pairs:
            self._pairs[spec] = ModelPair(spec.fp32, spec.quantized, dict(spec.mapping) or None)
        return self._pairs[spec]

    def runtime_options(self) -> RuntimeOptions:
        """onnxruntime options; a provider onnxruntime lacks is an error (it would fall back to CPU)."""
        import onnxruntime

        from pytest_qaccuracy.errors import InputError
        from pytest_qaccuracy.runtime import RuntimeOptions

        available = onnxruntime.get_available_providers()
        missing = [p for p in self.settings.providers if p not in available]
        if missing:
            where = self.settings.where("providers")
            raise InputError(f"{where}: {', '.join(missing)} not available (available: {', '.join(available)})")
        return RuntimeOptions(providers=self.settings.providers, batch_size=self.settings.batch_size)

    def metric_names(self, spec: PairSpec, rules: Sequence[Rule] = ()) -> tuple[str, ...]:
        """Configured metrics (all registered by default) plus what tolerances and rules need."""
        from pytest_qaccuracy.metrics import parse_metric_names

        base = parse_metric_names(list(self.settings.metrics) if self.settings.metrics else None)
        needed = ["cosine", "sqnr", "lsb", *spec.metrics, *(r.metric for r in rules)]
        return tuple(parse_metric_names(list(dict.fromkeys([*base, *needed]))))

    def compared(
        self, spec: PairSpec, rules: Sequence[Rule], tolerances: Tolerances, gate: bool = False
    ) -> tuple[ComparisonResult, OutputStats]:
        """:meth:`comparison` and :meth:`output_stats`; when neither is known yet, both come from one
        pass over the data, each model running once (the figures are those of two passes). With
        ``gate``, the pass also measures the pair's :meth:`agreement` when it is not known yet."""
        from pytest_qaccuracy.analysis.outputs import OutputMeasure
        from pytest_qaccuracy.errors import CheckError

        names = self.metric_names(spec, rules)
        stats_key, ks, rtol, atol = self._stats_key(spec, tolerances)
        if (spec, names) not in self._comparisons and stats_key not in self._stats:
            measure = OutputMeasure(ks, self._labels(spec), rtol, atol, spec.scores, spec.slices)
            agreement = self._agreement_pass(spec) if gate else None
            reference = self._new_reference(spec)
            try:
                self._comparisons[(spec, names)] = self._compare(spec, names, measure, agreement, reference)
                self._stats[stats_key] = measure.result()
            except CheckError:  # as in two passes: the comparison is recorded, then the statistics raise
                pass
            if reference is not None and (spec, names) in self._comparisons:
                self._references[(spec.fp32, spec.data)] = reference
            elif reference is not None:
                reference.release()
            measured = agreement.result() if agreement is not None and (spec, names) in self._comparisons else None
            if measured is not None:  # else the gate measures itself, and raises what failed here
                self._agreements[self._agreement_key(spec)] = measured
        return self.comparison(spec, rules), self.output_stats(spec, tolerances)

    def task_values(self, spec: PairSpec) -> dict[str, TaskValue]:
        """The pair's task metrics on both sides, measured once per process in a pass of their own
        with only the outputs fetched: the comparison's pass exposes intermediate tensors, which changes
        onnxruntime's fusions and so the quantized outputs (PP-OCRv4 rec, per-channel QDQ: CER 0.491 in
        that pass, 0.544 as deployed; docs/pytest.md), and a task metric gates the model as deployed."""
        if not spec.task_metrics:
            return {}
        self.declare_task_metrics(spec.task_metrics)
        key = replace(spec, targets=())  # the host's deployment target is the pair's own run: measured once
        if key not in self._task_values:
            from pytest_qaccuracy.analysis.outputs import measure_outputs

            tasks, targets = self.task_inputs(spec)
            stats = measure_outputs(
                self.model_pair(spec),
                spec.data,
                options=self.runtime_options(),
                backend=spec.backend,
                scheme=spec.compare_scheme,
                tasks=tasks,
                targets=targets,
                keep_task_errors=True,  # a metric that raises fails the checks of its values only
            )
            self._task_values[key] = stats.task
        return self._task_values[key]

    def _new_reference(self, spec: PairSpec) -> ReferenceCache | None:
        """A cache for the fp32 outputs of the pair's comparison, when a sensitivity analysis may
        read them at the end of the session and no comparison of these files filled one yet."""
        if self.settings.sensitivity == "off" or (spec.fp32, spec.data) in self._references:
            return None
        from pytest_qaccuracy.analysis.reference_cache import ReferenceBudget, ReferenceCache

        if self._reference_budget is None:
            self._reference_budget = ReferenceBudget()
        outputs = [f for f, _ in self.model_pair(spec).output_pairs()]
        return ReferenceCache(outputs, self._reference_budget, self.settings.sensitivity_records or None)

    def reference(self, spec: PairSpec) -> ReferenceCache | None:
        """The fp32 outputs the pair's comparison computed (:mod:`~pytest_qaccuracy.analysis.reference_cache`)."""
        return self._references.get((spec.fp32, spec.data))

    def _agreement_pass(self, spec: PairSpec) -> AgreementPass | None:
        """The pair's agreement gate to fold into its comparison, None when it is measured already."""
        if self._agreement_key(spec) in self._agreements:
            return None
        from pytest_qaccuracy.analysis.agreement_pass import AgreementPass
        from pytest_qaccuracy.backend.agreement import AgreementChecker

        return AgreementPass(AgreementChecker(spec.quantized, scheme=spec.scheme, tensors=self._read_floats(spec)))

    def _read_floats(self, spec: PairSpec) -> list[str]:
        """The quantized model's float tensors the pair's checks read (its 8-bit ones and its outputs
        are compared by the agreement gate anyway): layers left in float, float8 or 4-bit ones read
        after their DequantizeLinear."""
        return [m.capture for m in self.model_pair(spec).matching.matches if m.params is None]

    @staticmethod
    def _agreement_key(spec: PairSpec) -> tuple[Path, Path, str]:
        """The agreement's cache key: what it measures (quantized model, data, scheme)."""
        return (spec.quantized, spec.data, spec.scheme)

    def comparison(self, spec: PairSpec, rules: Sequence[Rule] = ()) -> ComparisonResult:
        """The pair's :class:`ComparisonResult`, computed once per process."""
        names = self.metric_names(spec, rules)
        if (spec, names) not in self._comparisons:
            self._comparisons[(spec, names)] = self._compare(spec, names)
        return self._comparisons[(spec, names)]

    def _compare(
        self,
        spec: PairSpec,
        names: tuple[str, ...],
        measure: OutputMeasure | None = None,
        agreement: AgreementPass | None = None,
        reference: ReferenceCache | None = None,
    ) -> ComparisonResult:
        from pytest_qaccuracy.analysis.compare import compare

        began = time.monotonic()  # the pair's check time: the unit of its analysis budget
        try:
            return compare(
                self.model_pair(spec),
                spec.data,
                list(names),
                self.runtime_options(),
                backend=spec.backend,
                scheme=spec.compare_scheme,
                slices=spec.slices,
                measure=measure,
                agreement=agreement,
                reference=reference,
            )
        finally:
            key = (spec.fp32, spec.quantized, spec.data)
            self._check_seconds[key] = self._check_seconds.get(key, 0.0) + time.monotonic() - began

    def check_seconds(self, spec: PairSpec) -> float:
        """Seconds this process spent comparing the pair's models on its data (the analysis budget's unit)."""
        return self._check_seconds.get((spec.fp32, spec.quantized, spec.data), 0.0)

    @staticmethod
    def _stats_key(spec: PairSpec, tolerances: Tolerances) -> tuple[StatsKey, list[int], float | None, float | None]:
        """The output statistics' cache key (pair, k, rtol, atol), their ks, rtol and atol."""
        k = int(tolerances["topk"].value or 1) if "topk" in tolerances else 1
        rtol = tolerances["rtol"].value if "rtol" in tolerances else None
        atol = tolerances["atol"].value if "atol" in tolerances else None
        return (spec, k, rtol, atol), sorted({1, k}), rtol, atol

    @staticmethod
    def _labels(spec: PairSpec) -> np.ndarray | None:
        import numpy as np

        return np.load(spec.labels, allow_pickle=False) if spec.labels else None

    def task_inputs(self, spec: PairSpec) -> tuple[Sequence[Any], list[Any] | None]:
        """The pair's task metrics and their targets from its ``task_targets`` file (checked against
        the records before anything runs; None: the dataset's own)."""
        targets = None
        if spec.task_targets is not None:
            from pytest_qaccuracy.data import load_dataset
            from pytest_qaccuracy.data.targets import read_sidecar

            with load_dataset(spec.data) as dataset:
                targets = read_sidecar(spec.task_targets, len(dataset))
        return spec.task_metrics, targets

    def output_stats(self, spec: PairSpec, tolerances: Tolerances) -> OutputStats:
        """Top-k counts and element checks of the outputs, computed once per (pair, k, rtol, atol)."""
        from pytest_qaccuracy.analysis.outputs import measure_outputs

        key, ks, rtol, atol = self._stats_key(spec, tolerances)
        if key not in self._stats:
            pair, options = self.model_pair(spec), self.runtime_options()
            backend, scheme = spec.backend, spec.compare_scheme
            self._stats[key] = measure_outputs(
                pair, spec.data, ks, self._labels(spec), rtol, atol, options, backend, scheme, spec.scores, spec.slices
            )
        stats = self._stats[key]
        return replace(stats, task=self.task_values(spec)) if spec.task_metrics else stats

    def agreement(self, spec: PairSpec, max_steps: int) -> AgreementResult:
        """The pair's :class:`AgreementResult` (its scheme vs onnxruntime over its dataset) judged
        against ``max_steps``; measured once per process per (quantized model, data, scheme), in the
        comparison's pass when the check that first needs it also compares the pair (:meth:`compared`)."""
        from pytest_qaccuracy.backend.agreement import dataset_agreement

        key = self._agreement_key(spec)
        if key not in self._agreements:
            batch_size = self.settings.batch_size
            self._agreements[key] = dataset_agreement(
                spec.quantized, spec.data, scheme=spec.scheme, batch_size=batch_size, tensors=self._read_floats(spec)
            )
        return self._agreements[key].with_max_steps(max_steps)

    def saturation(self, spec: PairSpec, preset: str) -> SaturationReport:
        """The pair's :class:`SaturationReport` (its quantized model on ``preset`` against exact sums),
        measured once per process per (quantized model, data, preset)."""
        from pytest_qaccuracy.analysis.saturation import measure_saturation

        key = (spec.quantized, spec.data, preset)
        if key not in self._saturation:
            self._saturation[key] = measure_saturation(
                spec.quantized, spec.data, batch_size=self.settings.batch_size, preset=preset
            )
        return self._saturation[key]

    def check(
        self,
        spec: PairSpec,
        tolerances: Tolerances,
        rules: Sequence[Rule],
        nodeid: str,
        drift: bool = True,
        measure: Tolerances | None = None,
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

        known = [r for (s, _), r in self._comparisons.items() if s == spec]
        result = (
            known[0] if known else ComparisonResult(spec.fp32.name, spec.quantized.name, spec.data.name, 0, {}, [], [])
        )
        outcome = Outcome(
            kind="error",
            check="error",
            scope="model",
            subject=f"pair '{spec.id}'",
            metric="error",
            op="",
            threshold=None,
            value=None,
            passed=False,
            source="exception",
            detail=line,
        )
        self._record(spec, result, None, [outcome], nodeid, xfail)

    def _check(
        self,
        spec: PairSpec,
        tolerances: Tolerances,
        rules: Sequence[Rule],
        nodeid: str,
        drift: bool,
        measure: Tolerances | None,
        xfail: str | None,
    ) -> CheckResult:
        from pytest_qaccuracy.analysis.checks import evaluate, gate_outcome, saturation_outcome
        from pytest_qaccuracy.analysis.saturation import overflowing_presets
        from pytest_qaccuracy.plugin.checks import failure_message, gate_notes, saturation_notes

        gate = GATE in tolerances or GATE in (measure or {})
        result, stats = self.compared(spec, rules, measure or tolerances, gate)
        outcomes = evaluate(result, stats, tolerances, rules, spec.id, spec.slices, whole=measure is None)
        extra: list[str] = []
        folder = compared_dir(self.settings) if drift else None
        if folder is not None:
            drift_rows, extra = self.drift(spec, result, folder, stats)
            outcomes += drift_rows
        targets, target_rows, runs = self._targets(spec, tolerances, rules, measure)
        outcomes += target_rows
        if SATURATION in tolerances:
            for preset in overflowing_presets(spec.targets):
                saturation = self.saturation(spec, preset)
                outcomes.append(saturation_outcome(saturation, tolerances[SATURATION]))
                if not outcomes[-1].passed:
                    extra += saturation_notes(saturation)
        agreement = None
        if GATE in tolerances:
            agreement = self.agreement(spec, int(tolerances[GATE].value or 0))
            outcomes.append(gate_outcome(agreement, tolerances[GATE].source))
            extra += gate_notes(agreement)
        failed = [o for o in outcomes if not o.passed]
        message = None
        if failed:
            if self.settings.artifacts_dir is not None:
                stem = spec.stem(self.rootpath)
                extra = [*extra, f"Artifacts: {self.settings.artifacts_dir / 'pairs' / comparison_name(stem)}"]
            gate_first = failed[0].check in (GATE, SATURATION)  # worst records and layers say nothing there
            # a failure on a deployment target shows that target's records, elements and layers
            shown, shown_stats = runs.get(failed[0].deployment or "", (result, stats))
            message = failure_message(spec.id, failed, None if gate_first else shown, shown_stats, extra)
        self._record(spec, result, stats, outcomes, nodeid, xfail, agreement, targets)
        properties = pair_properties(spec.id, spec.backend, result.scheme or _host_preset(), result, stats, not failed)
        properties += check_properties(outcomes) + target_properties(targets)
        properties += gate_properties(agreement) if agreement is not None else []
        return CheckResult(spec.id, outcomes, message, properties)

    def _targets(
        self,
        spec: PairSpec,
        tolerances: Tolerances,
        rules: Sequence[Rule],
        measure: Tolerances | None,
    ) -> tuple[dict[str, TargetRun], list[Outcome], dict[str, tuple[ComparisonResult, OutputStats | None]]]:
        """Per deployment target: its run (output figures, verdict), its output checks (labelled
        ``... on <target>``), and its ``(ComparisonResult, OutputStats)``. A target that is the pair's
        own run shows its figures and adds no checks."""
        from pytest_qaccuracy.analysis.checks import evaluate, on_target

        found: dict[str, TargetRun] = {}
        rows: list[Outcome] = []
        runs: dict[str, tuple[ComparisonResult, OutputStats | None]] = {}
        for target in spec.targets:
            run, name = spec.on_target(target)
            result, stats = self.compared(run, rules, measure or tolerances)
            own = (run.backend, run.compare_scheme) == (spec.backend, spec.compare_scheme)
            evaluated = evaluate(result, stats, tolerances, rules, spec.id, spec.slices, whole=measure is None)
            checked = on_target(evaluated, name)
            # the pair's own run: its checks are the pair's, not repeated; its verdict is theirs
            if not own:
                rows += checked
            found[name] = TargetRun(
                backend=run.backend,
                scheme=name,
                outputs={o.name: dict(o.metrics) for o in result.outputs},
                topk=dict(stats.topk) if stats is not None else {},
                passed=all(o.passed for o in checked),
                task={k: v.to_dict() for k, v in stats.task.items()} if stats is not None else {},
            )
            runs[name] = (result, stats)
        return found, rows, runs

    def drift(
        self, spec: PairSpec, result: ComparisonResult, directory: Path, stats: OutputStats | None = None
    ) -> tuple[list[Outcome], list[str]]:
        """Drift outcomes against the baseline saved in ``directory``, and notes (missing layers).

        A drift rule on a task value (``cer:+0.01``) applies to the pairs that compute it; others skip it."""
        from pytest_qaccuracy.report.baseline import (
            DEFAULT_DRIFT,
            changed_files,
            find_drift,
            find_improvements,
            load_baseline,
            parse_drift_rule,
        )

        path = baseline_path(directory, spec, self.rootpath)
        source = "--qaccuracy-baseline" if self.settings.baseline_required else f"baseline {shown(path, self.rootpath)}"

        def drift_row(
            target: str,
            metric: str,
            op: str,
            detail: str,
            passed: bool = False,
            threshold: float | None = None,
            value: float | None = None,
            drift: Drift | None = None,
        ) -> Outcome:
            scope = "model" if drift is None else drift.scope
            output = drift.name if drift is not None and scope == "output" else None
            return Outcome(
                kind="drift",
                check="drift",
                scope=scope,
                subject=target,
                metric=metric,
                op=op,
                threshold=threshold,
                value=value,
                passed=passed,
                source=source,
                detail=detail,
                output=output,
            )

        try:
            document = load_baseline(path)
        except ValueError as exc:  # the message names the file and the bad key
            return [drift_row("baseline", "baseline", "", f"unreadable baseline: {exc}")], []
        if document is None:
            # compared automatically, a new pair has none yet; or this session writes it
            if not self.settings.baseline_required or self.settings.save_baseline_dir == directory:
                return [], []
            detail = f"no baseline for pair '{spec.id}' in {directory} ({UPDATE_HINT})"
            return [drift_row("baseline", "baseline", "", detail)], []
        task = {k: v.to_dict() for k, v in stats.task.items()} if stats is not None else {}
        higher = {**result.higher_is_better, **{k: v["higher_is_better"] for k, v in task.items()}}
        declared = self.task_values_declared | set(self.settings_task_values())
        texts = [t for t in self.settings.max_drift or DEFAULT_DRIFT if not _other_task_value(t, higher, declared)]
        try:
            rules = [parse_drift_rule(t, higher) for t in texts]
        except ValueError as exc:
            known = ", ".join(sorted({*higher, *declared}))
            return [drift_row("baseline", "drift rule", "", f"{exc} (known: {known})")], []
        drifts, missing = find_drift(document, result, rules, task)
        better = find_improvements(document, result, rules, task)
        rows = [
            drift_row(d.target, d.metric, _drift_op(d), f"drift: {d.describe()}", False, d.allowed, d.current, d)
            for d in drifts
        ]
        if not rows:
            ok = f"no drift beyond {', '.join(r.text for r in rules)}"
            rows = [drift_row("baseline", "drift", "drift", ok, passed=True)]
        strict = self.settings.fail_on_improvement
        rows += [
            drift_row(d.target, d.metric, IMPROVED, f"improved: {d.describe()}", not strict, d.allowed, d.current, d)
            for d in better
        ]
        notes = [f"Not in this run (in the baseline): {', '.join(missing[:10])}"] if missing else []
        notes += changed_files(document, pair_files(spec))
        if better:
            shown_better = "; ".join(d.describe() for d in better[:3])
            more = f" and {len(better) - 3} more" if len(better) > 3 else ""
            notes.append(f"Better than the baseline: {shown_better}{more}")
        if drifts or (better and strict):
            notes.append("To accept these numbers as the new baseline: --qaccuracy-update-all-baselines")
        return rows, notes

    def declare_task_metrics(self, specs: Any) -> None:
        """Remember the value names of task metrics some pair computes (collection, each measure)."""
        for spec in specs or ():
            try:
                self.task_values_declared.update(spec.value_names(spec.create()))
            except Exception:  # an unusable metric is reported where it is used
                continue

    def settings_task_values(self) -> list[str]:
        """The value names of the ini file's task metrics."""
        from pytest_qaccuracy.metrics.task import TaskSpec

        names: list[str] = []
        for text in self.settings.task_metrics or ():
            try:
                spec = TaskSpec.parse(text)
                names += list(spec.value_names(spec.create()))
            except Exception:
                continue
        return names

    def _record(
        self,
        spec: PairSpec,
        result: ComparisonResult,
        stats: OutputStats | None,
        outcomes: Sequence[Outcome],
        nodeid: str,
        xfail: str | None,
        agreement: AgreementResult | None = None,
        targets: Mapping[str, TargetRun] | None = None,
    ) -> None:
        """Add a check's outcomes (and what it measured besides) to the pair's record."""
        key = spec.key(self.rootpath)
        record = self.records.get(key) or PairRecord(
            id=spec.id,
            key=key,
            stem=spec.stem(self.rootpath),
            fp32=str(spec.fp32),
            quantized=str(spec.quantized),
            data=str(spec.data),
            labels=str(spec.labels) if spec.labels else None,
            backend=spec.backend,
            scheme=result.scheme or spec.scheme,  # the integer backend's preset, resolved
            comparison=result.to_dict(),
        )
        checks = [RecordedCheck(test=nodeid, index=i, outcome=o, xfail=xfail) for i, o in enumerate(outcomes)]
        self.records[key] = replace(
            record.with_checks(checks),
            topk={**record.topk, **stats.topk} if stats is not None else record.topk,
            task={**record.task, **{k: v.to_dict() for k, v in stats.task.items()}}
            if stats is not None
            else record.task,
            agreement=record.agreement if agreement is None else agreement_record(agreement),
            targets=merge_targets(record.targets, targets or {}),
        )

    def analyse(self) -> None:
        """Sensitivity of the pairs the settings select, into their records (:mod:`.sensitivity`)."""
        try:
            analyse_records(self, {spec.key(self.rootpath): spec for spec in self._pairs})
        finally:  # the kept outputs served their purpose
            for reference in self._references.values():
                reference.release()
            self._references.clear()

    # -- xdist ---------------------------------------------------------------------------------
    def payload(self, interrupted: str | None = None) -> dict[str, Any]:
        """Everything a worker sends the controller, as plain builtins (:class:`WorkerPayload`)."""
        return WorkerPayload(records=self.records, interrupted=interrupted).to_wire()

    def merge(self, wire: Mapping[str, Any] | None) -> None:
        """Fold a worker's payload into the records; a worker that sent none (it crashed) is counted."""
        payload = WorkerPayload.from_wire(wire)
        if payload is None:
            self.workers_without_data += 1
            return
        for key, record in payload.records.items():
            mine = self.records.get(key)
            if mine is None:
                self.records[key] = record
                continue
            seen = {(c.test, c.index) for c in mine.checks}
            self.records[key] = replace(
                mine.with_checks([c for c in record.checks if (c.test, c.index) not in seen]),
                topk={**mine.topk, **record.topk},
                task={**mine.task, **record.task},
                sensitivity=merge_entry(mine.sensitivity, record.sensitivity),
                agreement=mine.agreement or record.agreement,
                targets=merge_targets(mine.targets, record.targets),
            )

    def record_report(self, outcome: str, nodeid: str, reason: str | None) -> None:
        """pytest's outcome of a test phase (:func:`~pytest_qaccuracy.plugin.judged_outcome`); a failure stays."""
        if self.test_outcomes.get(nodeid, ("",))[0] not in ("failed", XPASS_STRICT):
            self.test_outcomes[nodeid] = (outcome, reason)

    def sorted_records(self) -> list[PairRecord]:
        """Records in a stable order, checks sorted by test and position (same with or without xdist),
        each as pytest judged its tests (:meth:`PairRecord.with_pytest_outcomes`)."""
        records = sorted(self.records.values(), key=lambda r: (r.id, r.key))
        return [r.with_pytest_outcomes(self.test_outcomes).sorted() for r in records]

    def documents(self) -> list[dict[str, Any]]:
        """:meth:`sorted_records` as the mappings the report writers read (:meth:`PairRecord.to_dict`)."""
        return [record.to_dict() for record in self.sorted_records()]

    # -- end of session (controller only) ------------------------------------------------------
    def finish(self, prune_refused: str | None = None) -> bool:
        """Write artifacts and baselines; called once, on the controller. False if a write failed
        (the reason is in ``errors``, for the terminal summary). ``prune_refused``: why stale
        baselines must be kept although pruning was asked for."""
        from pytest_qaccuracy.errors import QAccuracyError
        from pytest_qaccuracy.plugin.artifacts import publish_artifacts, write_report
        from pytest_qaccuracy.plugin.baselines import finish_baselines

        records = self.sorted_records()
        if not records:
            return True
        documents = [record.to_dict() for record in records]
        try:  # baselines first: they are committed, and must not depend on the report writers
            self.baselines, written = finish_baselines(self.settings, records, self.rootpath, prune_refused)
            self.written += written
            if self.settings.artifacts_dir is not None:
                report = self.settings.report
                folder, root = self.settings.artifacts_dir, self.rootpath
                self.written += publish_artifacts(folder, documents, root, report, self.status)
            elif self.settings.report is not None:  # --qaccuracy-no-artifacts, but a report asked for
                self.written.append(write_report(self.settings.report, documents, status=self.status))
        except (OSError, ValueError, QAccuracyError) as exc:
            self.errors.append(f"could not write qaccuracy artifacts: {type(exc).__name__}: {exc}")
            return False
        return True


def _drift_op(drift: Any) -> str:
    """The bound a drift broke: at least the allowed value when it lies below the baseline's."""
    return ">=" if drift.allowed <= drift.baseline else "<="


def _other_task_value(text: str, known: Mapping[str, bool], declared: set[str]) -> bool:
    """Whether drift rule ``text`` names a task value another pair of the session computes (not this
    pair, not a registered metric): skipped here. A name no pair computes is not skipped: the rule
    then fails as unknown, naming the known metrics."""
    from pytest_qaccuracy.metrics import available_metrics
    from pytest_qaccuracy.report.baseline import parse_drift_rule

    try:
        metric = parse_drift_rule(text).metric
    except ValueError:
        return False
    return metric not in known and metric not in available_metrics() and metric in declared


def _host_preset() -> str:
    """This machine's onnxruntime preset (where a pair on onnxruntime ran)."""
    from pytest_qaccuracy.backend.host import host_preset

    return host_preset()
