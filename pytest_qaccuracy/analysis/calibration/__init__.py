"""Calibration: our own range methods (ONE record-minmax, MXNet/TVM KL, MSE, power-of-two scales)
over streaming statistics, a ``CalibrationDataReader`` over our datasets, and QDQ models written by
onnxruntime's quantizer with the ranges we chose.
"""

from pytest_qaccuracy.analysis.calibration.calibrator import calibrate, calibration_tensors, compute_ranges
from pytest_qaccuracy.analysis.calibration.options import METHODS, CalibrationOptions, CalibrationResult
from pytest_qaccuracy.analysis.calibration.quantize import quantize_with_ranges
from pytest_qaccuracy.analysis.calibration.ranges import (
    kl_threshold,
    moving_average,
    mse_range,
    one_percentile,
    power2_range,
    power2_scale,
)

__all__ = [
    "METHODS",
    "CalibrationOptions",
    "CalibrationResult",
    "calibrate",
    "calibration_tensors",
    "compute_ranges",
    "kl_threshold",
    "moving_average",
    "mse_range",
    "one_percentile",
    "power2_range",
    "power2_scale",
    "quantize_with_ranges",
]
