"""Experiment: ``auto``'s last step with min/max judged leave-one-out (docs/calibration.md, "Min/max
judged leave-one-out"): each calibration record runs on the min/max model of the other records'
extrema, and min/max's error and the other finalists' record counts are judged against that. Runs
``bench/calibration_quality.py`` with ``verified_choice`` replaced; ``RULE=least`` takes the least
judged error instead of the majority rule::

    RULE=least python bench/auto_leave_one_out.py --models ppocr_cls --recipes u8s8 --methods auto

Prints each row's finalists (``LOO: ...``) before the row. Not the library's ``auto``: a measured
variant, kept to reproduce the figures.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pytest_qaccuracy.analysis.calibration import auto, qdq_params

#: what the patched steps leave for the last one: the first pass's extrema, the parameter model
STATE: dict = {}
_extrema_pass = auto.extrema_pass


def _kept_extrema(*args, **kwargs):
    STATE["extrema"] = _extrema_pass(*args, **kwargs)
    return STATE["extrema"]


class _KeptParamModel(auto.ParamModel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        STATE["params"] = self


def _per_record(evaluator, runs_for):
    """``runs_for(s)`` -> {name: (session, feeds)}: every record's squared errors per output, and energies."""
    if evaluator._reference is None:
        evaluator._reference = evaluator.session(evaluator._fp32, "fp32 model")
    errors, energies = [], []
    for s, record in enumerate(evaluator.bound.iter_records()):
        ref = [v.astype(np.float64) for v in auto._run(evaluator._reference, evaluator.outputs, record, "fp32")]
        energies.append(np.array([np.sum(np.square(r)) for r in ref]))
        mine = {}
        for name, (session, feeds) in runs_for(s).items():
            got = auto._run(session, evaluator.outputs, {**record, **feeds}, "quantized")
            mine[name] = np.array([np.sum(np.square(g - r)) for g, r in zip(got, ref, strict=True)])
        errors.append(mine)
    return errors, energies


def _leave_one_out(evaluator, models, extrema, params):
    """record index -> a session of the min/max model made without that record's extrema."""
    count = len(evaluator.bound)
    sessions = {}

    def session(s: int):
        if s not in sessions:
            ranges = {}
            for tensor in params.tensors:
                seen = extrema.per_record.get(tensor)
                if seen is None or seen.mins.size != count:
                    continue
                lo, hi = float(np.min(np.delete(seen.mins, s))), float(np.max(np.delete(seen.maxs, s)))
                if (lo, hi) != extrema.observed[tensor]:
                    ranges[tensor] = (lo, hi)
            model = params.patched(models["minmax"], ranges) if ranges else models["minmax"]
            sessions[s] = evaluator.session(model)
        return sessions[s]

    return session


def verified_choice(evaluator, final, models, write, report):
    """The finalists run as onnxruntime runs them, min/max judged leave-one-out."""
    count = len(evaluator.bound)
    loo = _leave_one_out(evaluator, models, STATE["extrema"], STATE["params"])
    real = {name: (evaluator.session(models[name]), {}) for name in final}
    errors, energies = _per_record(evaluator, lambda s: {**real, "minmax-loo": (loo(s), {})})
    energy = np.sum(energies, axis=0)
    total = {
        k: float(np.mean(np.sum([r[k] for r in errors], axis=0) / np.where(energy > 0, energy, 1.0))) for k in real
    }
    total["minmax-loo"] = float(
        np.mean(np.sum([r["minmax-loo"] for r in errors], axis=0) / np.where(energy > 0, energy, 1.0))
    )
    scales = [np.where(p > 0, p, 1.0) for p in energies]
    wins = {
        k: sum(
            float(np.mean(r[k] / c)) < float(np.mean(r["minmax-loo"] / c)) for r, c in zip(errors, scales, strict=True)
        )
        for k in final
    }
    judged = {**total, "minmax": total["minmax-loo"]}
    for name in final:
        step = auto._step(f"{name}, as onnxruntime runs it (leave-one-out min/max)", judged[name])
        report["steps"].append(step | {"verified": True, "better_than_minmax_on": wins[name]})
    trusted = list(final) if os.environ.get("RULE") == "least" else auto.majority(final, wins, count)
    best = min(trusted, key=lambda name: (judged[name], final.index(name)))
    figures = ", ".join(f"{k} {total[k]:.4g} wins {wins[k]}" for k in final)
    print(f"LOO: minmax full {total['minmax']:.4g} loo {total['minmax-loo']:.4g}; {figures} -> {best}", flush=True)
    if best == "minmax":
        return auto.Choice(best, total["minmax"])
    actual = write(best)
    if qdq_params.same_model(actual, models[best]):
        return auto.Choice(best, total[best])
    models[best] = actual  # onnxruntime's own write differs: kept only if still better than min/max
    again = evaluator.errors({n: (evaluator.session(models[n]), {}) for n in ("minmax", best)}, against="minmax")
    return auto.Choice(best, again[best]) if again[best] < again["minmax"] else auto.Choice("minmax", again["minmax"])


if __name__ == "__main__":
    auto.extrema_pass = _kept_extrema
    auto.ParamModel = _KeptParamModel
    auto.verified_choice = verified_choice
    sys.argv = ["calibration_quality.py", *sys.argv[1:]]
    runpy.run_path(str(Path(__file__).with_name("calibration_quality.py")), run_name="__main__")
