"""``auto`` calibration: each activation's range chosen among every method's by its measured effect.

1. **Statistics** (two passes, as ``kl``; the fp32 model observed as onnxruntime's calibrators do):
   extrema, then the histograms of the tensors onnxruntime quantizes (the min/max model, written by
   onnxruntime after the first pass, says which).
2. **Candidates**: each tensor's range by every rule of ``candidates.CANDIDATES`` (minmax, ONE
   percentile and moving average, KL, MSE, onnxruntime's percentile rule); ranges that quantize
   alike count once.
3. **Per tensor** (``probe``, riding along the first measuring pass): each distinct candidate's
   relative error at the tensor's consumers; the tensor's winner is the least.
4. **Whole model** (``qdq_params``: the min/max model's activation scales and zero points become
   inputs of one session): the output error on the calibration records of every rule applied to all
   tensors, then of the per-tensor winners, whole and group by group (contiguous in graph order)
   over the best rule, and of the groups that helped, together.
5. **Verified**: every choice of steps 3-4 (min/max and onnxruntime's percentile rule, the ranges of
   onnxruntime's own calibrators, first) run by onnxruntime on the calibration records, each as the
   min/max model onnxruntime wrote with its parameters set as onnxruntime sets them
   (``ParamModel.patched``: one write instead of one per choice). The parameterized model computes
   in float where the real one runs integer kernels, which can rank choices differently (u8 x s8
   pairs saturate on CPUs without VNNI).
6. **Chosen**: the least output error among min/max and the choices better than min/max on more
   than half of the records (:func:`majority`); a choice other than min/max is written by onnxruntime
   and compared with the model measured, and run again if they differ (:func:`verified_choice`).

The output error of a choice is the mean over the model's float outputs of
``sum (quantized - fp32)^2 / sum fp32^2`` over all calibration records; its SQNR is ``-10 log10``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.calibration import candidates as C
from pytest_qaccuracy.analysis.calibration.observers import (
    ExtremaObserver,
    HistogramObserver,
    MagnitudeHistogramObserver,
    MinMaxObserver,
    magnitude_minimum,
    record_extrema,
    shifted,
)
from pytest_qaccuracy.analysis.calibration.probe import ProbeScores, build_probe, output_names
from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel, same_model, scale_zero_point
from pytest_qaccuracy.data import BoundDataset
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.ort_session import first_line, make_session
from pytest_qaccuracy.runtime import RuntimeOptions

#: the per-tensor winners are tried in at most this many contiguous groups
GROUPS = 4
#: the name of the per-tensor winners' whole-model choice
MIXED = "per-tensor"
#: the probe model's graph optimization level: its session is made in half the time of ``all``'s
#: (0.48 against 0.9-1.1 s on the corpus recognizer: 8,516 nodes), and its sums are scores, not
#: what onnxruntime runs (the same per-tensor winners there; the pass's output errors within 2e-5 dB)
PROBE_OPTIMIZATION = "basic"


@dataclass(frozen=True, slots=True)
class Choice:
    """One whole-model choice of ranges and its measured output error on the calibration records."""

    name: str
    error: float

    @property
    def sqnr_db(self) -> float:
        return float("inf") if self.error <= 0 else float(-10.0 * np.log10(self.error))


@dataclass(slots=True)
class Extrema:
    """What the first pass keeps of each tensor: global extrema, every record's extrema, min |x|."""

    observed: dict[str, tuple[float, float]]
    per_record: dict[str, ExtremaObserver]
    smallest_magnitude: dict[str, float]


def extrema_pass(passes: Callable[[], Any], names: Sequence[str], records: int) -> Extrema:
    """The first pass: every tensor's global and per-record extrema and its smallest magnitude."""
    minmax = {n: MinMaxObserver() for n in names}
    per_record = {n: ExtremaObserver() for n in names}
    smallest = dict.fromkeys(names, np.inf)
    with task("calibrate", records) as advance:
        for values, count in passes():
            for name, value in values.items():
                mins, maxs = record_extrema(value, count)
                minmax[name].update(mins, maxs)
                per_record[name].update(mins, maxs)
                if np.isfinite(mins).any():
                    smallest[name] = min(smallest[name], magnitude_minimum(value, mins, maxs))
            advance(count)
    unseen = [n for n, o in minmax.items() if not o.seen]
    if unseen:
        raise InputError(f"tensor(s) {unseen[:5]} held no finite value on any record; cannot calibrate them")
    return Extrema({n: (o.min, o.max) for n, o in minmax.items()}, per_record, smallest)


def histogram_pass(
    passes: Callable[[], Any],
    names: Sequence[str],
    extrema: Extrema,
    records: int,
    kinds: Sequence[str] = C.HISTOGRAM_KINDS,
) -> dict[str, C.TensorStats]:
    """The second pass: the histograms of ``names`` named by ``kinds`` (:data:`~.candidates.HISTOGRAM_KINDS`:
    ``kl``, ``mse`` and onnxruntime's percentile ``magnitude``; the others stay None). Each costs its own
    fold over every value (the recipe search asks for one rule's at a time, ``auto`` for all three)."""
    unknown = [k for k in kinds if k not in C.HISTOGRAM_KINDS]
    if unknown:
        raise ValueError(f"unknown histogram kind {unknown[0]!r}; expected one of {', '.join(C.HISTOGRAM_KINDS)}")
    stats = {}
    for n in names:
        observed = extrema.observed[n]
        bound = max(abs(observed[0]), abs(observed[1]))
        kl = HistogramObserver(bound, C.R.KL_BINS) if "kl" in kinds else None
        mse = HistogramObserver(bound, C.MSE_BINS) if "mse" in kinds else None
        magnitude = MagnitudeHistogramObserver(extrema.smallest_magnitude[n], bound) if "magnitude" in kinds else None
        stats[n] = C.TensorStats(observed, extrema.per_record[n], kl, mse, magnitude)

    def fold(item: tuple[str, np.ndarray]) -> None:
        s = stats[item[0]]
        binned = [h for h in (s.kl, s.mse) if h is not None]
        if binned:
            x = shifted(item[1], binned[0].bound)  # one float64 copy for both histograms
            for histogram in binned:
                histogram.fold_shifted(x)
        if s.magnitude is not None:
            s.magnitude.update(item[1])

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool, task("calibrate", records) as advance:
        for values, count in passes():
            list(pool.map(fold, [(n, v) for n, v in values.items() if n in stats]))
            del values
            advance(count)
    return stats


def all_candidates(
    stats: Mapping[str, C.TensorStats], options: C.CandidateOptions
) -> dict[str, dict[str, tuple[float, float]]]:
    """Every rule's range of every tensor (searched side by side in threads: numpy releases the GIL)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        found = pool.map(lambda s: C.candidate_ranges(s, options), stats.values())
        return dict(zip(stats, found, strict=True))


#: how a quantized model is run for one choice: its session and the inputs fed beside the record's
Run = tuple[Any, Mapping[str, np.ndarray]]


class Evaluator:
    """Output error of quantized models against the fp32 model on the calibration records, several
    per pass: the parameterized QDQ model fed each choice's ranges (:meth:`choices`), or real models.

    The fp32 outputs of a pass come from the fp32 model, or from the probe model (which computes
    them too) when a probe rides along. With onnxruntime choosing the threads (``threads=0``), the
    sessions are single-threaded and a record's runs go side by side, one per core: on the corpus
    recognizer 1.3-1.4x the runs of one session with every core (small nodes scale poorly).
    """

    def __init__(
        self, fp32: onnx.ModelProto, bound: BoundDataset, options: RuntimeOptions, label: str = "auto: measure"
    ) -> None:
        self.bound = bound
        self.label = label
        self.options = options
        self._fp32 = fp32
        self._reference = None
        self.outputs = [o.name for o in fp32.graph.output if _is_float(fp32, o.name)]
        self.passes = 0
        self.wins: dict[str, int] = {}
        self._sessions: dict[int, tuple[onnx.ModelProto, Any]] = {}
        self._workers = (os.cpu_count() or 1) if options.threads == 0 else 1
        self._threads = replace(options, threads=1) if self._workers > 1 else options

    def session(self, model: onnx.ModelProto, label: str = "quantized model", optimization: str = "") -> Any:
        """A session of ``model``, made once per model object (kept with it, so that its id is not
        reused by another model while the session is remembered); ``optimization`` overrides the
        options' graph optimization level."""
        if id(model) not in self._sessions:
            options = replace(self._threads, optimization=optimization) if optimization else self._threads
            self._sessions[id(model)] = (model, _session(model, options, label))
        return self._sessions[id(model)][1]

    def sessions(self, models: Mapping[str, onnx.ModelProto]) -> dict[str, Any]:
        """A session of each model (:meth:`session`), made side by side: onnxruntime releases the GIL
        while it builds one."""
        unique = list({id(m): m for m in models.values()}.values())
        with ThreadPoolExecutor(max_workers=self._workers) as pool:
            list(pool.map(self.session, unique))
        return {name: self.session(model) for name, model in models.items()}

    def errors(
        self,
        runs: Mapping[str, Run],
        probe: tuple[Any, Sequence[str], ProbeScores] | None = None,
        against: str | None = None,
    ) -> dict[str, float]:
        """Each run's mean over outputs of squared error / energy, over all records; ``probe``
        (session, output names, sums) is run on the same records and its sums folded. With ``against``
        (one of ``runs``), :attr:`wins` counts for each run the records on which its own error is below
        that run's (:func:`majority`)."""
        if probe is None and self._reference is None:
            self._reference = self.session(self._fp32, "fp32 model")
        session, extra, sums = probe if probe is not None else (self._reference, [], None)
        err = {name: np.zeros(len(self.outputs)) for name in runs}
        energy = np.zeros(len(self.outputs))
        self.wins = dict.fromkeys(runs, 0)
        self.passes += 1
        pool = ThreadPoolExecutor(max_workers=self._workers)
        with pool, task(self.label, len(self.bound)) as advance:
            for record in self.bound.iter_records():
                fp32 = pool.submit(_run, session, [*self.outputs, *extra], record, "fp32 model")
                quantized = {
                    name: pool.submit(_run, s, self.outputs, {**record, **feeds}, "quantized model")
                    for name, (s, feeds) in runs.items()
                }
                values = fp32.result()
                ref = [v.astype(np.float64) for v in values[: len(self.outputs)]]
                if sums is not None:
                    sums.add(dict(zip(extra, values[len(self.outputs) :], strict=True)))
                power = np.array([np.sum(np.square(r)) for r in ref])
                energy += power
                mine = {}
                for name, future in quantized.items():
                    got = future.result()
                    mine[name] = np.array([np.sum(np.square(g - r)) for g, r in zip(got, ref, strict=True)])
                    err[name] += mine[name]
                if against is not None:
                    scale = np.where(power > 0, power, 1.0)
                    rival = float(np.mean(mine[against] / scale))
                    for name, e in mine.items():
                        self.wins[name] += float(np.mean(e / scale)) < rival
                advance(1)
        safe = np.where(energy > 0, energy, 1.0)
        return {name: float(np.mean(np.where(energy > 0, e / safe, e))) for name, e in err.items()}


def choice_runs(session: Any, params: ParamModel, choices: Mapping[str, Mapping[str, tuple[float, float]]]) -> dict:
    """The parameterized model's runs for each choice of ranges."""
    return {name: (session, params.feeds(ranges)) for name, ranges in choices.items()}


def _is_float(model: onnx.ModelProto, name: str) -> bool:
    value = next((o for o in model.graph.output if o.name == name), None)
    kind = value.type.tensor_type.elem_type if value is not None else onnx.TensorProto.FLOAT
    return kind in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def _session(model: onnx.ModelProto, options: RuntimeOptions, label: str):
    try:
        return make_session(
            model, providers=options.providers, threads=options.threads, optimization=options.optimization
        )
    except Exception as exc:
        raise ModelError(f"auto calibration: onnxruntime cannot load the {label} ({first_line(exc)})") from None


def _run(session, names: Sequence[str], feeds: Mapping[str, np.ndarray], label: str) -> list[np.ndarray]:
    try:
        return [np.asarray(v) for v in session.run(list(names), dict(feeds))]
    except Exception as exc:
        raise ModelError(f"auto calibration: onnxruntime failed to run the {label} ({first_line(exc)})") from None


def distinct(ranges: Mapping[str, tuple[float, float]], activation_type: str) -> dict[tuple[float, float], list[str]]:
    """The candidate ranges that quantize differently, each with the rules that give it."""
    keys: dict[tuple[float, float], tuple[float, float]] = {}
    out: dict[tuple[float, float], list[str]] = {}
    for rule, r in ranges.items():
        s, z = scale_zero_point(*r, activation_type)
        first = keys.setdefault((float(s), float(z)), r)
        out.setdefault(first, []).append(rule)
    return out


def _step(name: str, error: float) -> dict[str, Any]:
    return {"choice": name, "output_error": error, "output_sqnr_db": Choice(name, error).sqnr_db}


#: which rule gives each tensor's range
Assignment = dict[str, str]


def ranges_of(assignment: Mapping[str, str], found: Mapping[str, Mapping[str, tuple[float, float]]]) -> dict:
    """The ranges an assignment of rules gives, from one set of candidates."""
    return {t: found[t][rule] for t, rule in assignment.items()}


def choose(
    evaluator: Evaluator,
    fp32: onnx.ModelProto,
    params: ParamModel,
    found: Mapping[str, Mapping[str, tuple[float, float]]],
    activation_type: str,
) -> tuple[dict[str, tuple[Assignment, float]], dict[str, Any]]:
    """Every whole-model choice measured on the parameterized model (its rule per tensor and output
    error), and the report of how they were found (``CalibrationResult.selection``, completed by the
    caller)."""
    rules = list(C.CANDIDATES)
    groups = {t: distinct(found[t], activation_type) for t in params.tensors}
    probed = {t: list(g) for t, g in groups.items() if len(g) > 1}
    quantized = evaluator.session(params.model)

    def measure(choices: Mapping[str, Assignment], probe: Any = None) -> dict[str, float]:
        ranges = {name: ranges_of(a, found) for name, a in choices.items()}
        return evaluator.errors(choice_runs(quantized, params, ranges), probe)

    # pass 3: every rule applied to all tensors, with the probe of each tensor's candidates alongside
    uniform: dict[str, Assignment] = {}
    for rule in rules:  # rules that give the same model are measured once
        same = any(all(found[t][rule] == found[t][other[t]] for t in params.tensors) for other in uniform.values())
        if not same:
            uniform[rule] = dict.fromkeys(params.tensors, rule)
    probe = None
    if probed:
        model, entries = build_probe(fp32, probed, activation_type)
        session = evaluator.session(model, "probe model", PROBE_OPTIMIZATION)
        probe = (session, output_names(entries), ProbeScores(entries))
    measured = measure(uniform, probe)
    scores = {t: dict.fromkeys(found[t], 0.0) for t in params.tensors}
    if probe is not None:
        for tensor, found_scores in probe[2].by_tensor().items():
            scores[tensor] = {rule: score for r, score in found_scores for rule in groups[tensor][r]}
    winners = {t: min(rules, key=lambda rule, t=t: (scores[t][rule], rules.index(rule))) for t in params.tensors}
    best = min(measured, key=lambda name: (measured[name], rules.index(name)))
    chosen, current = uniform[best], measured[best]
    steps = [_step(name, e) for name, e in measured.items()]
    evaluated = {name: (uniform[name], e) for name, e in measured.items()}
    # pass 4: the per-tensor winners, whole and in contiguous groups over the best rule
    differing = [t for t in params.tensors if found[t][winners[t]] != found[t][chosen[t]]]
    if differing:
        mixed = {**chosen, **{t: winners[t] for t in differing}}
        parts = [list(g) for g in np.array_split(np.array(differing, dtype=object), min(GROUPS, len(differing)))]
        trial = {MIXED: mixed}
        if len(parts) > 1:
            for i, part in enumerate(parts):
                trial[f"{best} + {MIXED} group {i + 1}/{len(parts)}"] = {**chosen, **{t: winners[t] for t in part}}
        got = measure(trial)
        steps += [_step(name, e) for name, e in got.items()]
        kept = [name for name, e in got.items() if name != MIXED and e < current]
        if len(kept) > 1:  # pass 5: the groups that helped, together
            name = f"{best} + {MIXED} groups " + ", ".join(n.rsplit(" ", 1)[1] for n in kept)
            trial[name] = {**chosen, **{t: r for n in kept for t, r in trial[n].items() if r != chosen[t]}}
            got[name] = measure({name: trial[name]})[name]
            steps.append(_step(name, got[name]))
        evaluated.update({name: (trial[name], e) for name, e in got.items()})
    tensors = {
        t: {
            "candidates": {rule: {"range": list(found[t][rule]), "score": scores[t][rule]} for rule in rules},
            "winner": winners[t],
        }
        for t in params.tensors
    }
    report = {"records": len(evaluator.bound), "passes": 2 + evaluator.passes, "steps": steps, "tensors": tensors}
    return evaluated, report


def finalists(evaluated: Mapping[str, tuple[Assignment, float]]) -> list[str]:
    """The choices built and run for real: every choice measured, min/max and onnxruntime's percentile
    rule (the ranges of onnxruntime's own calibrators) first.

    Not only the best on the parameterized model: with the majority rule, every choice verified as
    onnxruntime runs it gave 19 of 27 held-out rows at or above onnxruntime's best calibrator on a
    VNNI host, against 14 for min/max, the percentile rule and the best in float
    (``bench/calibration_choices.py``, docs/calibration.md)."""
    return list(dict.fromkeys(n for n in ("minmax", "ort-percentile", *evaluated) if n in evaluated))


def majority(final: Sequence[str], wins: Mapping[str, int], records: int) -> list[str]:
    """The finalists that may replace min/max (onnxruntime's own default): min/max itself and those
    whose error, as onnxruntime runs them, is below min/max's on more than half the calibration records.

    An output error summed over few records is ruled by the worst of them: on the corpus's PP-LCNet
    classifier (s8s8, 16 records) a per-tensor choice was 9 dB better than min/max on 3 records and
    equal on 13, and 1.4 dB worse on 128 held-out records. A choice that helps most records (the
    PP-OCRv4 detector's MSE ranges: all 8) carries over."""
    return [name for name in final if name == "minmax" or 2 * wins.get(name, 0) > records]


def auto_ranges(
    model_path: str | os.PathLike[str],
    proto: onnx.ModelProto,
    bound: BoundDataset,
    names: Sequence[str],
    passes: Callable[[], Any],
    calibration: Any,
    options: RuntimeOptions,
    nodes_to_exclude: Sequence[str] = (),
) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]], dict[str, Any], bytes]:
    """(chosen ranges, observed extrema, selection report, the chosen model as onnxruntime wrote it)."""
    from pytest_qaccuracy.analysis.calibration.options import QTYPES, CalibrationResult
    from pytest_qaccuracy.analysis.calibration.quantize import quantize_with_ranges

    extrema = extrema_pass(passes, names, len(bound))
    observed = extrema.observed
    payloads: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="qaccuracy-auto-") as tmp:

        def written(name: str, ranges: Mapping[str, tuple[float, float]], form: Any = calibration) -> onnx.ModelProto:
            result = CalibrationResult(name, len(bound), {**observed, **ranges})
            path = quantize_with_ranges(model_path, Path(tmp) / "model.onnx", result, form, nodes_to_exclude)
            payloads[name] = path.read_bytes()
            return onnx.load_from_string(payloads[name])

        # the choices are measured on the QDQ form (its activation parameters become inputs), the
        # finalists in the form asked for; only the tensors onnxruntime quantizes are chosen
        qdq = written("minmax", observed, replace(calibration, quant_format="qdq"))
        models = {"minmax": qdq} if calibration.quant_format == "qdq" else {}
        params = ParamModel(qdq, proto, observed, calibration.activation_type)
        stats = histogram_pass(passes, params.tensors, extrema, len(bound))
        qmin, qmax = QTYPES[calibration.activation_type]
        rules = C.CandidateOptions(
            qmin, qmax, calibration.percentiles, calibration.moving_average, calibration.quantized_bins
        )
        found = all_candidates(stats, rules)
        evaluator = Evaluator(proto, bound, options)
        evaluated, report = choose(evaluator, proto, params, found, calibration.activation_type)
        # the finalists as onnxruntime runs them: the parameterized model computes in float where the
        # real one runs integer kernels (u8 x s8 pairs saturate on CPUs without VNNI). Each is the
        # min/max model with its parameters set as onnxruntime sets them; the chosen one is then
        # written by onnxruntime and compared (:func:`verified_choice`)
        final = finalists(evaluated)
        choices = {name: ranges_of(evaluated[name][0], found) for name in final}
        if "minmax" not in models:
            models["minmax"] = written("minmax", observed)
        models.update({name: params.patched(models["minmax"], choices[name]) for name in final if name not in models})
        best = verified_choice(evaluator, final, models, lambda name: written(name, choices[name]), report)
    report["passes"] += 1
    report |= {"chosen": best.name, "output_sqnr_db": best.sqnr_db}
    chosen = {**observed, **choices[best.name]}
    for tensor, entry in report["tensors"].items():
        entry["chosen"] = list(chosen[tensor])
    return chosen, observed, report, payloads[best.name]


def verified_choice(
    evaluator: Evaluator,
    final: Sequence[str],
    models: dict[str, onnx.ModelProto],
    write: Callable[[str], onnx.ModelProto],
    report: dict[str, Any],
) -> Choice:
    """The finalists run by onnxruntime; the chosen one among min/max and those better on most records
    (:func:`majority`). A choice other than min/max is then written by onnxruntime and compared with
    the model it was measured as; if they differ (a rule of onnxruntime's the patch does not copy),
    onnxruntime's model is run and the choice made again between it and min/max."""
    made = evaluator.sessions({name: models[name] for name in final})
    real = evaluator.errors({name: (made[name], {}) for name in final}, against="minmax")
    wins = dict(evaluator.wins)
    first = len(report["steps"])
    report["steps"] += [
        _step(f"{name}, as onnxruntime runs it", real[name]) | {"verified": True, "better_than_minmax_on": wins[name]}
        for name in final
    ]
    trusted = majority(final, wins, len(evaluator.bound))
    best = min(trusted, key=lambda name: (real[name], final.index(name)))
    if best == "minmax":
        return Choice(best, real[best])
    actual = write(best)
    if same_model(actual, models[best]):
        return Choice(best, real[best])
    models[best] = actual
    again = evaluator.errors(
        {name: (evaluator.session(models[name]), {}) for name in ("minmax", best)}, against="minmax"
    )
    report["passes"] += 1
    step = first + final.index(best)
    report["steps"][step] = _step(f"{best}, as onnxruntime runs it", again[best]) | {
        "verified": True,
        "better_than_minmax_on": evaluator.wins[best],
        "measured_again": True,
    }
    keep = best in majority([best], evaluator.wins, len(evaluator.bound)) and again[best] < again["minmax"]
    return Choice(best, again[best]) if keep else Choice("minmax", again["minmax"])


def selection_line(selection: Mapping[str, Any]) -> str:
    """One line: what ``auto`` chose, as onnxruntime ran it, against min/max, the best of the better
    choices it refused (they helped too few records) and how many others it ran (``--json`` has all)."""
    suffix = ", as onnxruntime runs it"
    records, chosen = selection["records"], selection["output_sqnr_db"]
    verified = [
        (step["choice"].removesuffix(suffix), step)
        for step in selection["steps"]
        if step.get("verified") and step["choice"].removesuffix(suffix) != selection["chosen"]
    ]
    refused = sorted((s for _, s in verified if s["output_sqnr_db"] > chosen), key=lambda s: -s["output_sqnr_db"])
    # min/max is never refused: the choice kept has the least error among min/max and the trusted ones
    others = [f"minmax {s['output_sqnr_db']:.2f} dB" for n, s in verified if n == "minmax"]
    if refused:
        best, more = refused[0], len(refused) - 1
        others.append(
            f"{best['choice'].removesuffix(suffix)} {best['output_sqnr_db']:.2f} dB but better than minmax on only "
            f"{best['better_than_minmax_on']} of {records} records"
            + (f", and {more} more better choice{'s' if more > 1 else ''} on too few records" if more else "")
        )
    rest = sum(n != "minmax" and s["output_sqnr_db"] <= chosen for n, s in verified)
    if rest:
        others.append(f"{rest} other choice{'s' if rest > 1 else ''} no better")
    return (
        f"auto chose {selection['chosen']}: output SQNR {selection['output_sqnr_db']:.2f} dB on the "
        f"{records} calibration record(s) as onnxruntime runs it" + (f" ({'; '.join(others)})" if others else "")
    )


def check_against_minmax(
    fp32: str | os.PathLike[str],
    written: str | os.PathLike[str],
    result: Any,
    data: Any,
    calibration: Any,
    options: RuntimeOptions,
    nodes_to_exclude: Sequence[str] = (),
) -> str | None:
    """A warning when the written model's outputs are further from fp32 on the calibration records
    than onnxruntime's model with min/max ranges (written too, then both run: one more pass), else None."""
    from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
    from pytest_qaccuracy.analysis.calibration.quantize import quantize_with_ranges
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    proto = load_model(fp32)
    minmax = CalibrationResult("minmax", result.records, {**result.ranges, **result.observed})
    with tempfile.TemporaryDirectory(prefix="qaccuracy-check-") as tmp:
        other = quantize_with_ranges(fp32, Path(tmp) / "minmax.onnx", minmax, calibration, nodes_to_exclude)
        dataset = load_dataset(data)
        try:
            evaluator = Evaluator(proto, bind_dataset(dataset, graph_inputs(proto)), options, "calibrate: check")
            runs = {result.method: load_model(written), "minmax": load_model(other)}
            got = evaluator.errors({name: (evaluator.session(m), {}) for name, m in runs.items()})
        finally:
            dataset.close()
    mine, plain = Choice(result.method, got[result.method]), Choice("minmax", got["minmax"])
    if mine.error <= plain.error:
        return None
    return (
        f"{result.method} ranges give an output SQNR of {mine.sqnr_db:.2f} dB on the {result.records} calibration "
        f"record(s), below min/max's {plain.sqnr_db:.2f} dB; --method auto chooses per tensor by measured effect"
    )
