"""Writing a recipe's model with onnxruntime's ``quantize_static``, calibrating once per method.

Ranges depend only on the calibration method (and, for ``mse`` and ``power2``, the activation
type), not on which nodes are excluded or widened: they are computed once per method and handed to
every later ``quantize_static`` call as its calibration cache, so one experiment costs one
``quantize_static`` (no calibration pass). onnxruntime's own calibrators (``ort-minmax``,
``ort-entropy``, ``ort-percentile``) run through onnxruntime's ``create_calibrator`` on the same
records with the defaults ``quantize_static`` gives them; their ranges are cached the same way.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.calibration import METHODS, CalibrationOptions, compute_ranges, quantize_with_ranges
from pytest_qaccuracy.analysis.calibration import candidates as C
from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
from pytest_qaccuracy.analysis.calibration.quantize import PER_CHANNEL_OPSET, opset_note
from pytest_qaccuracy.analysis.recipe.space import ORT_METHODS, Recipe, refusal
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.runtime import RuntimeOptions


def method_names() -> tuple[str, ...]:
    """Every calibration method a recipe may name: ours (``METHODS``, read when called, so a method
    added there joins the search) and onnxruntime's own."""
    return (*METHODS, *ORT_METHODS)


#: Methods the search leaves out unless named (``auto`` writes and runs several models of its own).
OPT_IN = ("auto",)


def default_methods() -> tuple[str, ...]:
    """The calibration methods a search tries when none are named: all but :data:`OPT_IN`, those
    whose ranges need a histogram pass last, cheapest first (:data:`HISTOGRAM_RULES`: a budget that
    ends early has tried the cheap ones)."""
    names = [m for m in method_names() if m not in OPT_IN]
    return tuple(sorted(names, key=method_rank))


#: How a method's ranges are estimated from the shared statistics (onnxruntime's MinMax calibrator is
#: min/max; its Entropy calibrator with the defaults quantize_static gives it is too, docs/calibration.md).
ESTIMATED_AS = {"ort-minmax": "minmax", "ort-entropy": "minmax"}
#: What a histogram pass of one kind (:data:`~pytest_qaccuracy.analysis.calibration.candidates.HISTOGRAM_KINDS`)
#: and its rule cost, in extrema passes (the extrema pass's own time measures the model's runs).
#: Measured on YOLOv8n (8 records, 473 MB of activations) and the PP-OCRv4 recognizer (8 records,
#: 1.6 GB), the host under load: ``mse`` 1.9x / 1.3x, the magnitude histogram (``ort-percentile``)
#: 2.2x / 2.1x, ``kl`` 2.4x / 2.6x (its 8001-bin rule alone 1.6 s / 5.7 s on a quieter host: up to 4.6x).
#: Together in one pass the three cost 3.1x / 5.8x (before the rules): a pass per kind is cheaper as long as the
#: search stops before it needs all three.
HISTOGRAM_PASSES = {"mse": 2.0, "magnitude": 2.5, "kl": 3.5}
#: onnxruntime's own calibrators, run when a recipe naming them is first written, in extrema passes
#: (the PP-OCRv4 recognizer, host under load: its Percentile calibrator about 10 s against a 1.15 s
#: extrema pass; Entropy collects the same histograms; MinMax runs onnxruntime's augmented model once).
ORT_PASSES = {"ort-minmax": 2.0, "ort-entropy": 9.0, "ort-percentile": 9.0}
#: Rules that need a histogram pass (the others read the extrema pass alone), cheapest first.
HISTOGRAM_RULES = tuple(sorted(C.HISTOGRAM_OF, key=lambda rule: HISTOGRAM_PASSES[C.HISTOGRAM_OF[rule]]))


def method_rank(method: str) -> tuple[int, float]:
    """Where a method comes in the search: those of the extrema pass first, then the histogram rules
    by their expected cost (:data:`HISTOGRAM_PASSES`)."""
    kind = C.HISTOGRAM_OF.get(ESTIMATED_AS.get(method, method))
    return (0, 0.0) if kind is None else (1, HISTOGRAM_PASSES[kind])


def check_method(name: str) -> str:
    if name not in method_names():
        raise InputError(f"unknown calibration method {name!r}; expected one of {', '.join(method_names())}")
    return name


class RecipeBuilder:
    """Writes the QDQ model of any recipe of one fp32 model, with ranges computed once per method.

    Args:
        fp32: the fp32 model's path.
        calibration: the calibration records (path or open dataset).
        options: onnxruntime options for the calibration passes.
    """

    def __init__(
        self, fp32: str | os.PathLike[str], calibration: Dataset | str | os.PathLike[str], options: RuntimeOptions
    ) -> None:
        self.fp32, self.calibration, self.options = Path(fp32), calibration, options
        self.model = onnx.load(str(self.fp32), load_external_data=False)
        self._ranges: dict[tuple[str, str], CalibrationResult] = {}
        self._estimated: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
        self._stats: dict[str, Any] | None = None
        self._histograms: dict[str, C.TensorStats] = {}  # tensor -> its statistics, histograms as folded
        self.folded: list[str] = []  # the histogram kinds folded so far
        self.pass_seconds = 0.0  # the extrema pass's time
        self.reads = activation_tensors(self.model)
        self.weights = weight_tensors(self.model)

    def ranges(self, recipe: Recipe) -> CalibrationResult:
        """The recipe's ranges (computed on first use, then cached). Our methods' come from one set of
        statistics shared by all of them (:meth:`statistics`); onnxruntime's calibrators run their own pass."""
        wide = recipe.method in ("mse",)  # the only method whose range depends on the integer grid
        key = (recipe.method, recipe.activation_type if wide else "")
        if key not in self._ranges:
            if recipe.method in ORT_METHODS:
                self._ranges[key] = ort_ranges(self.fp32, self.calibration, ORT_METHODS[recipe.method])
            elif recipe.method in C.CANDIDATES:
                stats = self.statistics(C.HISTOGRAM_OF.get(recipe.method))
                ranges = self.estimated_ranges(recipe)
                self._ranges[key] = CalibrationResult(recipe.method, stats["records"], ranges, stats["observed"])
            else:
                options = CalibrationOptions(method=recipe.method, activation_type=recipe.activation_type)
                self._ranges[key] = compute_ranges(str(self.fp32), self.calibration, options, self.options)
        return self._ranges[key]

    def statistics(self, histogram: str | None = None) -> dict[str, Any]:
        """Every calibrated tensor's extrema (one pass over the records) and, when asked, its
        ``histogram`` (one of ``candidates.HISTOGRAM_KINDS``: a pass of its own, folding that kind only,
        since each kind's fold costs about as much as the model's runs): what the rules of
        ``candidates.CANDIDATES`` read, each computed once."""
        from pytest_qaccuracy.analysis.calibration.auto import extrema_pass, histogram_pass
        from pytest_qaccuracy.analysis.calibration.calibrator import _passes, calibration_tensors
        from pytest_qaccuracy.data import bind_dataset, load_dataset
        from pytest_qaccuracy.model.loading import graph_inputs, load_model
        from pytest_qaccuracy.runtime import OrtRunner

        if self._stats is not None and (histogram is None or histogram in self.folded):
            return self._stats
        proto = load_model(str(self.fp32))
        own = not isinstance(self.calibration, Dataset)
        dataset = load_dataset(self.calibration) if own else self.calibration
        try:
            bound = bind_dataset(dataset, graph_inputs(proto))
            names = calibration_tensors(proto)
            inputs = {spec.name for spec in bound.inputs}
            runner = OrtRunner(proto, [n for n in names if n not in inputs], self.options, "calibration")

            def passes() -> Any:
                return _passes(runner, bound, self.options.batch_size, names)

            if self._stats is None:
                began = time.monotonic()
                extrema = extrema_pass(passes, names, len(bound))
                self._stats = {
                    "records": len(bound),
                    "names": names,
                    "observed": extrema.observed,
                    "per_record": extrema.per_record,
                    "extrema": extrema,
                }
                self.pass_seconds = time.monotonic() - began
            if histogram is not None:
                folded = histogram_pass(passes, names, self._stats["extrema"], len(bound), (histogram,))
                for name, stats in folded.items():
                    merged = self._histograms.setdefault(name, stats)
                    setattr(merged, histogram, getattr(stats, histogram))
                self.folded.append(histogram)
        finally:
            if own:
                dataset.close()
        return self._stats

    def expected_seconds(self, recipe: Recipe) -> float:
        """What computing the recipe's estimated ranges is expected to cost: nothing once its
        statistics exist, else its histogram's :data:`HISTOGRAM_PASSES` passes over the records (the
        histogram pass and the rule), from the extrema pass's time."""
        kind = self.needs(recipe)
        return 0.0 if kind is None else HISTOGRAM_PASSES[kind] * self.pass_seconds

    def write_seconds(self, recipe: Recipe) -> float:
        """What writing the recipe's model costs before ``quantize_static`` itself: onnxruntime's own
        calibrator (:data:`ORT_PASSES` extrema passes) the first time a recipe names it, else nothing."""
        if recipe.method in ORT_METHODS and (recipe.method, "") not in self._ranges:
            return ORT_PASSES.get(recipe.method, max(ORT_PASSES.values())) * self.pass_seconds
        return 0.0

    def needs(self, recipe: Recipe) -> str | None:
        """The histogram kind the recipe's estimated ranges still need a pass for (None: none)."""
        kind = C.HISTOGRAM_OF.get(ESTIMATED_AS.get(recipe.method, recipe.method))
        return None if kind in self.folded else kind

    def estimated_ranges(self, recipe: Recipe) -> dict[str, tuple[float, float]]:
        """The recipe's ranges from the shared statistics: exactly ours for our methods, onnxruntime's
        calibrators approximated (:data:`ESTIMATED_AS`, onnxruntime's percentile rule on our histogram)."""
        from pytest_qaccuracy.analysis.calibration.options import QTYPES

        rule = ESTIMATED_AS.get(recipe.method, recipe.method)
        if rule not in C.CANDIDATES:
            return dict(self.ranges(recipe).ranges)
        key = (rule, recipe.activation_type if rule == "mse" else "")
        if key not in self._estimated:
            stats = self.statistics(C.HISTOGRAM_OF.get(rule))
            defaults = CalibrationOptions()
            options = C.CandidateOptions(
                *QTYPES[recipe.activation_type], defaults.percentiles, defaults.moving_average, defaults.quantized_bins
            )
            hist = self._histograms

            def one(name: str) -> tuple[float, float]:
                observed, per_record = stats["observed"][name], stats["per_record"][name]
                tensor = hist.get(name) or C.TensorStats(observed, per_record, None, None, None)
                return tuple(map(float, C.CANDIDATES[rule](tensor, options)))

            # numpy releases the GIL in the histogram rules: tensors side by side, as auto does
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                self._estimated[key] = dict(zip(stats["names"], pool.map(one, stats["names"]), strict=True))
        return self._estimated[key]

    def convert_opset(self, recipe: Recipe) -> int | None:
        """The opset :meth:`write` converts the fp32 model to before ``quantize_static`` (onnx's version
        converter: per-channel weights need DequantizeLinear's axis), or None when it is quantized as is."""
        options = CalibrationOptions(per_channel=recipe.per_channel)
        return None if opset_note(self.model, options) is None else PER_CHANNEL_OPSET

    def write(self, recipe: Recipe, out: str | os.PathLike[str]) -> Path:
        """onnxruntime's ``quantize_static`` writes the recipe's model to ``out``."""
        from onnxruntime.quantization import QuantType

        refused = refusal(recipe) if (recipe.narrowed | recipe.retyped) - recipe.float else None
        if refused is not None:  # per-node weight moves onnxruntime cannot write (the global ones: its own error)
            raise InputError(f"recipe {recipe.changes_from(Recipe())}: {refused}")
        calibration = CalibrationOptions(
            method="minmax",  # only the cache's ranges matter from here on
            activation_type=recipe.activation_type,
            weight_type=recipe.weight_type,
            per_channel=recipe.per_channel,
        )
        overrides = {
            name: [{k: getattr(QuantType, v) if k == "quant_type" else v for k, v in entries[0].items()}]
            for name, entries in recipe.overrides(self.reads, self.weights).items()
        }
        return quantize_with_ranges(
            str(self.fp32),
            out,
            self.ranges(recipe),
            calibration,
            sorted(recipe.float),
            reduce_range=recipe.reduce_range,
            overrides=overrides,
        )


def activation_tensors(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Node -> the float activation tensors it reads and writes (what a 16-bit node widens)."""
    view = GraphView(model)
    constant = set(view.initializers) | {o for n in view.nodes if n.op_type == "Constant" for o in n.output}
    return {
        node.name: [t for t in [*node.input, *node.output] if t and t not in constant]
        for node in view.nodes
        if node.name
    }


def weight_tensors(model: onnx.ModelProto) -> dict[str, tuple[str, int]]:
    """Node -> its weight initializer and the channel axis onnxruntime's QDQ quantizer gives it, for
    the nodes whose weight granularity a recipe may flip: Conv, ConvTranspose, Gemm and MatMul with
    an initializer weight of their own (a weight shared by several nodes has one granularity)."""
    from pytest_qaccuracy.analysis.recipe.edit import WEIGHT_OPS, weight_axis

    view = GraphView(model)
    users: dict[str, int] = {}
    for node in view.nodes:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    table = {}
    for node in view.nodes:
        if node.name and node.op_type in WEIGHT_OPS and len(node.input) > 1:
            weight = view.initializers.get(node.input[1])
            if weight is None or users[node.input[1]] != 1:
                continue
            axis = weight_axis(node.op_type, 1, len(weight.dims), {a.name: a.i for a in node.attribute})
            if axis is not None:
                table[node.name] = (node.input[1], axis)
    return table


def ort_ranges(
    fp32: Path, calibration: Dataset | str | os.PathLike[str], method: str, extra: Mapping[str, Any] | None = None
) -> CalibrationResult:
    """Ranges from onnxruntime's own calibrator ``method`` (MinMax, Entropy, Percentile) with the
    defaults ``quantize_static`` gives it, on every calibration record."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator

    from pytest_qaccuracy.analysis.calibration.reader import DatasetReader

    reader = DatasetReader(calibration, str(fp32))
    chatter = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="qaccuracy-recipe-") as tmp:
        root = logging.getLogger()
        level = root.level
        root.setLevel(max(level, logging.ERROR))
        try:
            calibrator = create_calibrator(
                str(fp32),
                None,
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=getattr(CalibrationMethod, method),
                extra_options=dict(extra or {}),
            )
            # onnxruntime's histogram calibrators print their progress ("Number of tensors : 9"): kept
            # for an error (this call's prints only), else dropped (the search's own lines say the rest)
            with contextlib.redirect_stdout(chatter):
                calibrator.collect_data(reader)
                data = calibrator.compute_data()
        except (ValueError, KeyError, RuntimeError) as exc:
            said = "; ".join(line.strip() for line in chatter.getvalue().splitlines()[-4:] if line.strip())
            printed = f"; it printed: {said}" if said else ""
            raise InputError(f"{fp32}: onnxruntime's {method} calibrator failed ({exc}){printed}") from None
        finally:
            root.setLevel(level)
    ranges = {}
    for name, tensor in data.data.items():
        lo, hi = tensor.range_value  # arrays of one value (or one per channel): the tensor's extremes
        ranges[name] = (float(np.min(lo)), float(np.max(hi)))
    return CalibrationResult(f"ort-{method.lower()}", len(reader), ranges, {})


def check_onnxruntime() -> None:
    """InputError when this onnxruntime's quantizer takes no calibration cache: every recipe is written
    through one (``quantize_static(calibration_cache_path=...)``, ``save_tensors_data``)."""
    import inspect

    import onnxruntime
    from onnxruntime.quantization import calibrate, quantize_static

    takes = "calibration_cache_path" in inspect.signature(quantize_static).parameters
    if not takes or not hasattr(calibrate, "save_tensors_data"):
        raise InputError(
            f"the recipe search writes every recipe through onnxruntime's calibration cache "
            f"(quantize_static's calibration_cache_path), which onnxruntime {onnxruntime.__version__} lacks: "
            "upgrade onnxruntime to 1.27 or newer"
        )


def write_cache(result: CalibrationResult, path: str | os.PathLike[str]) -> Path:
    """The ranges as onnxruntime's calibration cache file (``calibration_cache_path``)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data

    from pytest_qaccuracy.atomic import atomic_write

    data = {n: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for n, (lo, hi) in result.ranges.items()}
    with tempfile.TemporaryDirectory(prefix="qaccuracy-recipe-") as tmp:
        staged = Path(tmp) / "ranges.json"
        save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), staged)
        payload = staged.read_bytes()
    return atomic_write(Path(path), lambda handle: handle.write(payload), mode="wb")
