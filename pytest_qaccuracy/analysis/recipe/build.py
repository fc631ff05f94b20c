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
import logging
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pytest_qaccuracy.analysis.calibration import METHODS, CalibrationOptions, compute_ranges, quantize_with_ranges
from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
from pytest_qaccuracy.analysis.recipe.space import ORT_METHODS, Recipe
from pytest_qaccuracy.data import Dataset
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model.graph import GraphView
from pytest_qaccuracy.runtime import RuntimeOptions


def method_names() -> tuple[str, ...]:
    """Every calibration method a recipe may name: ours (``METHODS``, read when called, so a method
    added there joins the search) and onnxruntime's own."""
    return (*METHODS, *ORT_METHODS)


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
        self.reads = activation_tensors(self.model)

    def ranges(self, recipe: Recipe) -> CalibrationResult:
        """The recipe's ranges (computed on first use, then cached)."""
        wide = recipe.method in ("mse",)  # the only method whose range depends on the integer grid
        key = (recipe.method, recipe.activation_type if wide else "")
        if key not in self._ranges:
            if recipe.method in ORT_METHODS:
                self._ranges[key] = ort_ranges(self.fp32, self.calibration, ORT_METHODS[recipe.method])
            else:
                options = CalibrationOptions(method=recipe.method, activation_type=recipe.activation_type)
                self._ranges[key] = compute_ranges(str(self.fp32), self.calibration, options, self.options)
        return self._ranges[key]

    def write(self, recipe: Recipe, out: str | os.PathLike[str]) -> Path:
        """onnxruntime's ``quantize_static`` writes the recipe's model to ``out``."""
        from onnxruntime.quantization import QuantType

        calibration = CalibrationOptions(
            method="minmax",  # only the cache's ranges matter from here on
            activation_type=recipe.activation_type,
            weight_type=recipe.weight_type,
            per_channel=recipe.per_channel,
        )
        overrides = {
            name: [{"quant_type": getattr(QuantType, entries[0]["quant_type"])}]
            for name, entries in recipe.overrides(self.reads).items()
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


def ort_ranges(
    fp32: Path, calibration: Dataset | str | os.PathLike[str], method: str, extra: Mapping[str, Any] | None = None
) -> CalibrationResult:
    """Ranges from onnxruntime's own calibrator ``method`` (MinMax, Entropy, Percentile) with the
    defaults ``quantize_static`` gives it, on every calibration record."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator

    from pytest_qaccuracy.analysis.calibration.reader import DatasetReader

    reader = DatasetReader(calibration, str(fp32))
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
            # onnxruntime's histogram calibrators print their progress: onto stderr, not the caller's stdout
            with contextlib.redirect_stdout(sys.stderr):
                calibrator.collect_data(reader)
                data = calibrator.compute_data()
        except (ValueError, KeyError, RuntimeError) as exc:
            raise InputError(f"{fp32}: onnxruntime's {method} calibrator failed ({exc})") from None
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
            "upgrade onnxruntime"
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


__all__ = [
    "RecipeBuilder",
    "activation_tensors",
    "check_method",
    "check_onnxruntime",
    "method_names",
    "ort_ranges",
    "write_cache",
]
