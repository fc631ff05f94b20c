"""``auto`` calibration: each activation's range chosen among every method's by its measured effect.

1. **Statistics** (two passes, as ``kl``): what every rule of ``candidates.CANDIDATES`` needs.
2. **Candidates**: each tensor's range by every rule (minmax, ONE percentile and moving average, KL,
   MSE, onnxruntime's percentile), the same range twice counted once.
3. **Per tensor** (one pass of ``probe``): each distinct candidate's relative error at the tensor's
   consumers; the tensor's winner is the least.
4. **Whole model** (``qdq_params``: onnxruntime writes the QDQ model once, its activation scales and
   zero points become inputs): the output error on the calibration records of every rule applied to
   all tensors, and of the per-tensor winners; then the winners taken group by group (contiguous in
   graph order) into the best whole-model choice, a group kept where it lowers the output error.
   The least output error wins, so the result is never worse on the calibration records than the
   best single rule, onnxruntime's ``MinMax`` and ``Percentile`` ranges among them.

The output error of a choice is the mean over the model's float outputs of
``sum (quantized - fp32)^2 / sum fp32^2`` over all calibration records; its SQNR is ``-10 log10``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.calibration import candidates as C
from pytest_qaccuracy.analysis.calibration.observers import (
    ExtremaObserver,
    HistogramObserver,
    MinMaxObserver,
    record_extrema,
    shifted,
)
from pytest_qaccuracy.analysis.calibration.probe import ProbeScores, build_probe, output_names
from pytest_qaccuracy.analysis.calibration.qdq_params import ParamModel, scale_zero_point
from pytest_qaccuracy.data import BoundDataset
from pytest_qaccuracy.data.progress import task
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.ort_session import first_line, make_session
from pytest_qaccuracy.runtime import RuntimeOptions

log = logging.getLogger(__name__)

#: the per-tensor winners are tried in at most this many contiguous groups
GROUPS = 4
#: the name of the per-tensor winners' whole-model choice
MIXED = "per-tensor"


@dataclass(frozen=True, slots=True)
class Choice:
    """One whole-model choice of ranges and its measured output error on the calibration records."""

    name: str
    error: float

    @property
    def sqnr_db(self) -> float:
        return float("inf") if self.error <= 0 else float(-10.0 * np.log10(self.error))


def gather_stats(
    passes: Callable[[], Any], names: Sequence[str], records: int
) -> tuple[dict[str, C.TensorStats], dict[str, tuple[float, float]]]:
    """Two passes over the records: extrema (global and per record), then histograms."""
    minmax = {n: MinMaxObserver() for n in names}
    per_record = {n: ExtremaObserver() for n in names}
    with task("calibrate", 2 * records) as advance:
        for values, count in passes():
            for name, value in values.items():
                mins, maxs = record_extrema(value, count)
                minmax[name].update(mins, maxs)
                per_record[name].update(mins, maxs)
            advance(count)
        unseen = [n for n, o in minmax.items() if not o.seen]
        if unseen:
            raise InputError(f"tensor(s) {unseen[:5]} held no finite value on any record; cannot calibrate them")
        observed = {n: (o.min, o.max) for n, o in minmax.items()}
        stats = {}
        for n in names:
            lo, hi = observed[n]
            bound = max(abs(lo), abs(hi))
            kl, mse = HistogramObserver(bound, C.R.KL_BINS), HistogramObserver(bound, C.MSE_BINS)
            stats[n] = C.TensorStats(observed[n], per_record[n], kl, mse)

        def fold(item: tuple[str, np.ndarray]) -> None:
            s = stats[item[0]]
            x = shifted(item[1], s.kl.bound)  # one float64 copy for both histograms
            s.kl.fold_shifted(x)
            s.mse.fold_shifted(x)

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for values, count in passes():
                list(pool.map(fold, values.items()))
                del values
                advance(count)
    return stats, observed


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
    them too) when a probe rides along.
    """

    def __init__(self, fp32: onnx.ModelProto, bound: BoundDataset, options: RuntimeOptions) -> None:
        self.bound = bound
        self.options = options
        self._fp32 = fp32
        self._reference = None
        self.outputs = [o.name for o in fp32.graph.output if _is_float(fp32, o.name)]
        self.passes = 0

    def session(self, model: onnx.ModelProto, label: str = "quantized model") -> Any:
        return _session(model, self.options, label)

    def errors(
        self, runs: Mapping[str, Run], probe: tuple[Any, Sequence[str], ProbeScores] | None = None
    ) -> dict[str, float]:
        """Each run's mean over outputs of squared error / energy, over all records; ``probe``
        (session, output names, sums) is run on the same records and its sums folded."""
        if probe is None and self._reference is None:
            self._reference = self.session(self._fp32, "fp32 model")
        session, extra, sums = probe if probe is not None else (self._reference, [], None)
        err = {name: np.zeros(len(self.outputs)) for name in runs}
        energy = np.zeros(len(self.outputs))
        self.passes += 1
        with task("auto: measure", len(self.bound)) as advance:
            for record in self.bound.iter_records():
                values = _run(session, [*self.outputs, *extra], record, "fp32 model")
                ref = [v.astype(np.float64) for v in values[: len(self.outputs)]]
                if sums is not None:
                    sums.add(dict(zip(extra, values[len(self.outputs) :], strict=True)))
                energy += [np.sum(np.square(r)) for r in ref]
                for name, (quantized, feeds) in runs.items():
                    got = _run(quantized, self.outputs, {**record, **feeds}, "quantized model")
                    err[name] += [np.sum(np.square(g - r)) for g, r in zip(got, ref, strict=True)]
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


def choose(
    fp32: onnx.ModelProto,
    qdq: onnx.ModelProto,
    bound: BoundDataset,
    found: Mapping[str, Mapping[str, tuple[float, float]]],
    activation_type: str,
    options: RuntimeOptions,
) -> tuple[dict[str, tuple[dict[str, tuple[float, float]], float]], dict[str, Any]]:
    """Every whole-model choice measured on the parameterized model (its ranges and output error),
    and the report of how they were found (``CalibrationResult.selection``, completed by the caller)."""
    rules = list(C.CANDIDATES)
    params = ParamModel(qdq, fp32, {t: r["minmax"] for t, r in found.items()}, activation_type)
    groups = {t: distinct(found[t], activation_type) for t in params.tensors}
    probed = {t: list(g) for t, g in groups.items() if len(g) > 1}
    evaluator = Evaluator(fp32, bound, options)
    quantized = evaluator.session(params.model)
    # pass 3: every rule applied to all tensors, with the probe of each tensor's candidates alongside
    uniform: dict[str, dict[str, tuple[float, float]]] = {}
    for rule in rules:  # rules that give the same model are measured once
        ranges = {t: r[rule] for t, r in found.items()}
        if not any(all(ranges[t] == other[t] for t in params.tensors) for other in uniform.values()):
            uniform[rule] = ranges
    probe = None
    if probed:
        model, entries = build_probe(fp32, probed, activation_type)
        probe = (_session(model, options, "probe model"), output_names(entries), ProbeScores(entries))
    measured = evaluator.errors(choice_runs(quantized, params, uniform), probe)
    scores = {t: dict.fromkeys(found[t], 0.0) for t in params.tensors}
    if probe is not None:
        for tensor, found_scores in probe[2].by_tensor().items():
            scores[tensor] = {rule: score for r, score in found_scores for rule in groups[tensor][r]}
    winners = {t: min(rules, key=lambda rule, t=t: (scores[t][rule], rules.index(rule))) for t in params.tensors}
    best = min(measured, key=lambda name: (measured[name], rules.index(name)))
    chosen, current = dict(uniform[best]), measured[best]
    steps = [_step(name, e) for name, e in measured.items()]
    evaluated = {name: (uniform[name], e) for name, e in measured.items()}
    # pass 4: the per-tensor winners, whole and in contiguous groups over the best rule
    differing = [t for t in params.tensors if found[t][winners[t]] != chosen[t]]
    if differing:
        mixed = {**chosen, **{t: found[t][winners[t]] for t in differing}}
        parts = [list(g) for g in np.array_split(np.array(differing, dtype=object), min(GROUPS, len(differing)))]
        trial = {MIXED: mixed}
        if len(parts) > 1:
            trial.update(
                {
                    f"{best} + {MIXED} group {i + 1}/{len(parts)}": {**chosen, **{t: mixed[t] for t in g}}
                    for i, g in enumerate(parts)
                }
            )
        got = evaluator.errors(choice_runs(quantized, params, trial))
        steps += [_step(name, e) for name, e in got.items()]
        kept = [name for name, e in got.items() if name != MIXED and e < current]
        if len(kept) > 1:  # pass 5: the groups that helped, together
            name = f"{best} + {MIXED} groups " + ", ".join(n.rsplit(" ", 1)[1] for n in kept)
            trial[name] = {**chosen, **{t: v for n in kept for t, v in trial[n].items() if v != chosen[t]}}
            got[name] = evaluator.errors(choice_runs(quantized, params, {name: trial[name]}))[name]
            steps.append(_step(name, got[name]))
        evaluated.update({name: (trial[name], e) for name, e in got.items()})
    tensors = {
        t: {
            "candidates": {rule: {"range": list(found[t][rule]), "score": scores[t][rule]} for rule in rules},
            "winner": winners[t],
        }
        for t in params.tensors
    }
    report = {"records": len(bound), "passes": 2 + evaluator.passes, "steps": steps, "tensors": tensors}
    return evaluated, report


def finalists(evaluated: Mapping[str, tuple[Mapping[str, tuple[float, float]], float]]) -> list[str]:
    """The choices built and run for real: min/max and onnxruntime's percentile rule (the ranges of
    onnxruntime's own calibrators), the best single rule and the best choice of all measured on the
    parameterized model."""
    ranked = sorted(evaluated, key=lambda name: evaluated[name][1])
    single = next((name for name in ranked if name in C.CANDIDATES), None)
    names = [n for n in ("minmax", "ort-percentile", single, ranked[0]) if n in evaluated]
    return list(dict.fromkeys(names))


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

    stats, observed = gather_stats(passes, names, len(bound))
    qmin, qmax = QTYPES[calibration.activation_type]
    found = all_candidates(
        stats,
        C.CandidateOptions(qmin, qmax, calibration.percentiles, calibration.moving_average, calibration.quantized_bins),
    )
    payloads: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="qaccuracy-auto-") as tmp:

        def written(name: str, ranges: Mapping[str, tuple[float, float]]) -> onnx.ModelProto:
            result = CalibrationResult(name, len(bound), {**observed, **ranges})
            path = quantize_with_ranges(model_path, Path(tmp) / "model.onnx", result, calibration, nodes_to_exclude)
            payloads[name] = path.read_bytes()
            return onnx.load_from_string(payloads[name])

        models = {"minmax": written("minmax", observed)}
        evaluated, report = choose(proto, models["minmax"], bound, found, calibration.activation_type, options)
        # the finalists as onnxruntime writes and runs them: the parameterized model computes in float
        # where the real one runs integer kernels (u8 x s8 pairs saturate on CPUs without VNNI)
        final = finalists(evaluated)
        models.update({name: written(name, evaluated[name][0]) for name in final if name not in models})
    evaluator = Evaluator(proto, bound, options)
    real = evaluator.errors({name: (evaluator.session(models[name]), {}) for name in final})
    best = min(final, key=lambda name: (real[name], final.index(name)))
    report["steps"] += [_step(f"{name}, as onnxruntime runs it", real[name]) | {"verified": True} for name in final]
    report["passes"] += 1
    report |= {"chosen": best, "output_sqnr_db": Choice(best, real[best]).sqnr_db}
    chosen = {**observed, **evaluated[best][0]}
    for tensor, entry in report["tensors"].items():
        entry["chosen"] = list(chosen[tensor])
    return chosen, observed, report, payloads[best]


def selection_line(selection: Mapping[str, Any]) -> str:
    """One line: what ``auto`` chose, and the output SQNR of every finalist as onnxruntime ran it."""
    suffix = ", as onnxruntime runs it"
    real = {s["choice"].removesuffix(suffix): s["output_sqnr_db"] for s in selection["steps"] if s.get("verified")}
    others = ", ".join(f"{name} {db:.2f}" for name, db in real.items() if name != selection["chosen"])
    return (
        f"auto chose {selection['chosen']}: output SQNR {selection['output_sqnr_db']:.2f} dB on the "
        f"{selection['records']} calibration record(s) as onnxruntime runs it" + (f" ({others} dB)" if others else "")
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
            evaluator = Evaluator(proto, bind_dataset(dataset, graph_inputs(proto)), options)
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
