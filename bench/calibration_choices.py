"""Every choice ``auto`` measures, run by onnxruntime on the calibration and on held-out records.

    python bench/calibration_choices.py [--models ppocr_rec,yolov8n] [--recipes u8s8,s8s8_pc]
                                        [--eval-records 128] --json OUT
    python bench/calibration_choices.py --rules OUT [OUT ...]   # the last step's rules, judged offline

``auto``'s last step chooses among finalists by their output error on the calibration records
(``docs/calibration.md``, step 6). This records, for every model and recipe of
``bench/calibration_quality.py`` (same calibration and held-out records), **every** choice ``auto``
measured in its steps 3-4 (each rule applied to every tensor, the per-tensor winners and their
groups), each as the min/max model with its parameters set as onnxruntime's quantizer sets them
(step 5), and onnxruntime's own MinMax and Percentile models; each run by onnxruntime on the
calibration records and on the held-out ones, each output's ``[energy, noise]`` per record.

``--rules`` then judges rules for the last step without running a model: each rule sees only the
calibration records' sums, and is scored by the held-out SQNR of what it picks against the best of
onnxruntime's calibrators; ``oracle`` picks by the held-out records, an upper bound no rule reaches.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

import calibration_quality as cq  # noqa: E402

#: onnxruntime's own calibrators (its Entropy writes MinMax's model through quantize_static)
ONNXRUNTIME = {"ort-minmax": "onnxruntime MinMax", "ort-percentile": "onnxruntime Percentile"}


def captured_choices(fp32: Path, calib: Path, recipe: str) -> tuple[dict[str, bytes], dict[str, float]]:
    """``auto``'s calibration of ``fp32``: every choice it measured as the model onnxruntime runs
    (``auto``: the model it chose), and each choice's output error on the parameterized model."""
    from pytest_qaccuracy.analysis.calibration import CalibrationOptions, auto, compute_ranges

    per_channel = recipe == "s8s8_pc"
    options = CalibrationOptions(
        method="auto",
        activation_type="int8" if per_channel else "uint8",
        per_channel=per_channel,
        quant_format="qoperator" if recipe == "qop_u8s8" else "qdq",
    )
    seen: dict[str, bytes] = {}
    verify = auto.verified_choice

    def record(evaluator, final, models, write, report):  # the finalists are every choice measured
        seen.update({name: models[name].SerializeToString() for name in final})
        return verify(evaluator, final, models, write, report)

    _last: dict = {}
    choose = auto.choose

    def remember(*args, **kwargs):
        evaluated, report = choose(*args, **kwargs)
        _last.clear()
        _last.update(evaluated)
        return evaluated, report

    auto.verified_choice, auto.choose = record, remember
    try:
        result = compute_ranges(fp32, calib, options)
    finally:
        auto.verified_choice, auto.choose = verify, choose
    seen["auto"] = result.model
    return seen, {name: error for name, (_, error) in _last.items()}


def run_sums(model: bytes | Path, records: list, reference: dict) -> dict[str, list]:
    """Each float output's per-record ``[energy, noise]`` of ``model`` on ``records``."""
    import onnxruntime as ort

    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    runs = [session.run(names, r) for r in records]
    got = {n: [np.ravel(run[i]) for run in runs] for i, n in enumerate(names)}
    return cq.per_record(reference, got)


def collect(args: argparse.Namespace) -> None:
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.loading import graph_inputs, load_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="qaccuracy-choices-") as tmp:
        folder = Path(tmp)
        for name in args.models.split(","):
            fp32, calib, data = cq.model_data(name, folder, args.eval_records)
            inputs = graph_inputs(load_model(fp32))
            sets = {
                "calib": list(bind_dataset(load_dataset(calib), inputs).iter_records()),
                "held_out": list(bind_dataset(load_dataset(data), inputs).iter_records()),
            }
            references = {k: cq.outputs(fp32, v) for k, v in sets.items()}
            for recipe in args.recipes.split(","):
                models, floats = captured_choices(fp32, calib, recipe)
                for method, title in ONNXRUNTIME.items():
                    out = folder / f"{name}.{recipe}.{method}.onnx"
                    cq.quantize(method, fp32, calib, out, recipe)
                    models[title] = out.read_bytes()
                row = {"model": name, "recipe": recipe, "float_error": floats, "choices": {}}
                for choice, model in models.items():
                    row["choices"][choice] = {k: run_sums(model, sets[k], references[k]) for k in sets}
                rows.append(row)
                partial = args.json.with_name(args.json.name + ".part")
                partial.write_text(json.dumps(rows))  # each row kept as it comes: a long run may be cut
                partial.replace(args.json)
                held = {c: cq.sqnr_of(arrays(s["held_out"])) for c, s in row["choices"].items()}
                print(name, recipe, " ".join(f"{c}={v:.2f}" for c, v in held.items()), flush=True)


def arrays(sums: dict[str, list]) -> dict[str, np.ndarray]:
    return {o: np.asarray(v) for o, v in sums.items()}


def record_errors(sums: dict[str, list]) -> np.ndarray:
    """Per record, the mean over outputs of noise / energy (auto's per-record error)."""
    parts = [a[:, 1] / np.where(a[:, 0] > 0, a[:, 0], 1.0) for a in arrays(sums).values()]
    return np.mean(parts, axis=0)


def total_error(sums: dict[str, list]) -> float:
    """auto's output error: mean over outputs of sum noise / sum energy."""
    return float(np.mean([a[:, 1].sum() / max(a[:, 0].sum(), 1e-300) for a in arrays(sums).values()]))


def _candidates(row: dict) -> list[str]:
    return [c for c in row["choices"] if c not in ONNXRUNTIME.values() and c != "auto"]


def rule_least(row: dict, names: list[str]) -> str:
    return min(names, key=lambda c: total_error(row["choices"][c]["calib"]))


def rule_majority(row: dict, names: list[str]) -> str:
    base = record_errors(row["choices"]["minmax"]["calib"])
    wins = {c: int(np.sum(record_errors(row["choices"][c]["calib"]) < base)) for c in names}
    trusted = [c for c in names if c == "minmax" or 2 * wins[c] > len(base)]
    return rule_least(row, trusted)


def rule_log_ratio(row: dict, names: list[str]) -> str:
    """The least geometric mean of per-record error ratios against min/max."""
    base = record_errors(row["choices"]["minmax"]["calib"])

    def score(c: str) -> float:
        mine = record_errors(row["choices"][c]["calib"])
        ok = (base > 0) & (mine > 0)
        return float(np.mean(np.log(mine[ok] / base[ok]))) if ok.any() else 0.0

    return min(names, key=score)


def rule_median(row: dict, names: list[str]) -> str:
    base = record_errors(row["choices"]["minmax"]["calib"])
    return min(names, key=lambda c: float(np.median(record_errors(row["choices"][c]["calib"]) - base)))


def three_finalists(row: dict) -> list[str]:
    """``auto``'s finalists before 2026-11-30: min/max, onnxruntime's percentile rule and the best
    choice on the parameterized model."""
    floats = row["float_error"]
    best = min(floats, key=floats.get)
    return list(dict.fromkeys(n for n in ("minmax", "ort-percentile", best) if n in floats))


def judge(rows: list[dict]) -> None:
    rules = {
        "three finalists, least": lambda r: rule_least(r, three_finalists(r)),
        "three finalists, majority (before)": lambda r: rule_majority(r, three_finalists(r)),
        "three finalists, log-ratio": lambda r: rule_log_ratio(r, three_finalists(r)),
        "three finalists, median": lambda r: rule_median(r, three_finalists(r)),
        "every choice, least": lambda r: rule_least(r, _candidates(r)),
        "every choice, majority (now)": lambda r: rule_majority(r, _candidates(r)),
        "every choice, log-ratio": lambda r: rule_log_ratio(r, _candidates(r)),
        "every choice, median": lambda r: rule_median(r, _candidates(r)),
        # what a user of onnxruntime alone can do: pick its calibrator by the calibration records
        "onnxruntime's own, least": lambda r: rule_least(r, list(ONNXRUNTIME.values())),
        "always minmax": lambda r: "minmax",
        "always ort-percentile": lambda r: "ort-percentile",
        "oracle, three finalists": lambda r: max(three_finalists(r), key=lambda c: held(r, c)),
        "oracle, every choice": lambda r: max(_candidates(r), key=lambda c: held(r, c)),
    }

    def held(row: dict, c: str) -> float:
        return cq.sqnr_of(arrays(row["choices"][c]["held_out"]))

    print(f"{'rule':36s} rows>=best  mean margin  worst")
    for title, rule in rules.items():
        margins = []
        for row in rows:
            best = max(held(row, m) for m in ONNXRUNTIME.values())
            margins.append(held(row, rule(row)) - best)
        margins = np.round(margins, 2)
        print(f"{title:36s} {np.sum(margins >= 0):3d}/{len(rows)}  {np.mean(margins):+10.2f}  {np.min(margins):+.2f}")
    print()
    for row in rows:
        best = max(held(row, m) for m in ONNXRUNTIME.values())
        picks = {t: rule(row) for t, rule in rules.items() if not t.startswith(("always", "oracle", "onnx"))}
        cells = " ".join(f"{held(row, c) - best:+.2f}" for c in picks.values())
        print(f"{row['model']:20s} {row['recipe']:9s} best {best:6.2f}  auto {held(row, 'auto') - best:+.2f}  {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join((*cq.MODELS, "net:detector", "net:mobile_detector")))
    parser.add_argument("--recipes", default="u8s8,s8s8_pc,qop_u8s8")
    parser.add_argument("--eval-records", type=int, default=128)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rules", type=Path, nargs="+", metavar="OUT.json", help="judge rules on these runs' rows")
    args = parser.parse_args()
    if args.rules:
        judge([row for path in args.rules for row in json.loads(path.read_text())])
    else:
        collect(args)


if __name__ == "__main__":
    main()
