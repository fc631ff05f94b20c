"""Calibration end to end: ranges from our observers, QDQ models written by onnxruntime's quantizer."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, calibrate, compute_ranges
from pytest_qaccuracy.analysis.calibration.reader import DatasetReader
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.cli import main
from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.model import ModelPair
from tests.modelzoo import mlp as modelzoo_mlp

ROOT = Path(__file__).resolve().parents[2]


def mlp(path: Path, features: int = 32, seed: int = 0) -> Path:
    """x[N, features] -> MatMul -> Relu -> MatMul -> y[N, 10]."""
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(features)
    w1 = (rng.standard_normal((features, features)) * scale).astype(np.float32)
    w2 = (rng.standard_normal((features, 10)) * scale).astype(np.float32)
    return modelzoo_mlp(path, w1, w2)


def npz(path: Path, records: np.ndarray) -> Path:
    np.savez(path, x=records)
    return path


@pytest.fixture(scope="module")
def outliers(tmp_path_factory):
    """100 calibration records, one of them with a spike of 300; 40 clean evaluation records."""
    logging.getLogger().setLevel(logging.ERROR)
    root = tmp_path_factory.mktemp("outliers")
    rng = np.random.default_rng(7)
    calib = rng.standard_normal((100, 1, 32)).astype(np.float32)
    calib[57, 0, 3] = 300.0
    return {
        "root": root,
        "fp32": mlp(root / "mlp.onnx"),
        "calib": npz(root / "calib.npz", calib),
        "eval": npz(root / "eval.npz", rng.standard_normal((40, 1, 32)).astype(np.float32)),
    }


def _output_mse(paths, method: str, **options) -> float:
    out = paths["root"] / f"mlp.{method}.onnx"
    calibrate(paths["fp32"], paths["calib"], out, CalibrationOptions(method=method, **options))
    result = compare(ModelPair(paths["fp32"], out), paths["eval"], "mse", layers=False)
    return result.outputs[0].metrics["mse"]


def test_kl_and_percentile_beat_minmax_on_activations_with_outliers(outliers):
    minmax = _output_mse(outliers, "minmax")
    assert minmax > 0.05  # a 300-wide grid for inputs of unit scale: the outputs are ruined
    assert _output_mse(outliers, "kl", bins=4001) < minmax / 10  # 0.15 wide bins: ~20 over the bulk
    assert _output_mse(outliers, "percentile") < minmax / 100  # 99th percentile of 100 maxima: 1% of the spike
    assert _output_mse(outliers, "moving-average") < minmax / 10  # the spike is one batch of 16 in 7, weighted 0.1
    # MSE keeps the spike: with 3,200 values per tensor, clipping 300 to ~4 costs more than a coarse grid
    assert _output_mse(outliers, "mse") <= minmax * 1.01


def test_percentile_and_moving_average_follow_one_over_per_record_extrema(outliers):
    records = np.load(outliers["calib"])["x"]
    maxima, minima = records.reshape(100, -1).max(axis=1), records.reshape(100, -1).min(axis=1)
    result = compute_ranges(outliers["fp32"], outliers["calib"], CalibrationOptions(method="percentile"))
    ordered = np.sort(maxima)  # (n-1) * 99 / 100 = 98.01: between the 99th and 100th largest
    assert result.ranges["x"][1] == pytest.approx(ordered[98] + 0.01 * (ordered[99] - ordered[98]), rel=1e-6)
    ordered = np.sort(minima)
    assert result.ranges["x"][0] == pytest.approx(ordered[0] + 0.99 * (ordered[1] - ordered[0]), rel=1e-6)
    result = compute_ranges(outliers["fp32"], outliers["calib"], CalibrationOptions(method="moving-average"))
    # docs/calibration.md: b_k = max of batch k of 16 records; c = b_0, then c = c (1 - C) + b_k C with
    # C = 0.1; unrolled over the K = 7 batches (the last holds 4 records):
    # c = b_0 0.9^(K-1) + sum_{k>=1} 0.1 b_k 0.9^(K-1-k)
    b = [maxima[16 * k : 16 * k + 16].max() for k in range(7)]
    expected = b[0] * 0.9**6 + sum(0.1 * b[k] * 0.9 ** (6 - k) for k in range(1, 7))
    assert b[3] == pytest.approx(300.0)  # the spike (record 57) is in batch 3, weighted 0.1 * 0.9^3
    assert result.ranges["x"][1] == pytest.approx(expected, rel=1e-6)
    assert result.observed["x"] == (pytest.approx(minima.min()), pytest.approx(300.0))


def _scales(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("scale")}


def _assert_u8_scales_follow(scales: dict[str, np.ndarray], ranges) -> None:
    """Each activation quantized with its own ``<tensor>_scale`` has the u8 scale of its range.

    onnxruntime 1.32 fuses Conv+Relu (no scale for the Conv output) and gives MaxPool and Flatten their
    input's scale, so 10 of the zoo net's 13 tensors carry their own scale; older versions give more
    tensors their own.
    """
    own = [name for name in ranges if f"{name}_scale" in scales]
    assert len(own) >= 10, own  # 10 on onnxruntime 1.32; 1.18 also gives its own scale to a few more
    for name in own:
        lo, hi = ranges[name]
        assert scales[f"{name}_scale"] == pytest.approx((max(hi, 0) - min(lo, 0)) / 255, rel=1e-6), name


@pytest.mark.parametrize("per_channel", [False, True])
def test_power2_scales_everywhere_and_the_model_runs(zoo, tmp_path, per_channel):
    out = tmp_path / "p2.onnx"
    options = CalibrationOptions(method="percentile", power2=True, per_channel=per_channel)
    calibrate(zoo["fp32"], zoo["data"], out, options)
    scales = _scales(out)
    assert len(scales) > 10 and any(s.size > 1 for s in scales.values()) == per_channel
    for name, scale in scales.items():
        exponents = np.log2(scale.astype(np.float64))
        assert np.all(exponents == np.round(exponents)), name
    result = compare(ModelPair(zoo["fp32"], out), zoo["data"], "cosine", layers=False)
    assert result.outputs[0].metrics["cosine"] > 0.999


def test_ranges_reach_the_written_model(zoo, tmp_path):
    out = tmp_path / "mm.onnx"
    result = calibrate(zoo["fp32"], zoo["data"], out, CalibrationOptions(method="minmax"))
    lo, hi = result.ranges["conv2"]
    assert _scales(out)["conv2_scale"] == pytest.approx((max(hi, 0) - min(lo, 0)) / 255, rel=1e-6)


def test_dataset_reader_feeds_quantize_static_directly(zoo, tmp_path):
    from onnxruntime.quantization import QuantType, quantize_static

    reader = DatasetReader(zoo["data"], zoo["fp32"])
    assert len(reader) == 12
    first = reader.get_next()
    assert set(first) == {"x"} and first["x"].shape == (1, 3, 16, 16)
    reader.set_range(10, 20)
    assert reader.get_next() is not None and reader.get_next() is not None and reader.get_next() is None
    ranges = compute_ranges(zoo["fp32"], zoo["data"], CalibrationOptions(method="minmax")).ranges
    written = []
    for extra in ({}, {"CalibStridedMinMax": 4}):  # strided: onnxruntime calls set_range(0, 4), (4, 8), ...
        reader.set_range(0, len(reader))
        out = tmp_path / f"direct{len(extra)}.onnx"
        quantize_static(str(zoo["fp32"]), str(out), reader, activation_type=QuantType.QUInt8, extra_options=extra)
        written.append(_scales(out))
    # every record reached onnxruntime's min/max, in one pass or in strides: the u8 scales of our minmax
    for scales in written:
        _assert_u8_scales_follow(scales, ranges)


def test_cli_calibrate_writes_the_ranges_it_reports(zoo, tmp_path, capsys):
    out = tmp_path / "cli.onnx"
    ranges = tmp_path / "ranges.json"
    code = main(
        [
            *("calibrate", str(zoo["fp32"]), "--data", str(zoo["data"]), "--method", "kl", "--bins", "1001"),
            *("--per-channel", "--out", str(out), "--json", str(ranges)),
        ]
    )
    assert code == 0 and f"wrote {out}" in capsys.readouterr().out
    document = json.loads(ranges.read_text())
    assert (document["method"], document["records"]) == ("kl", 12)
    scales = _scales(out)
    _assert_u8_scales_follow(scales, document["ranges"])  # the ranges written are the ranges used
    for name, (lo, hi) in document["ranges"].items():
        observed = document["observed"][name]
        assert observed[0] <= lo and hi <= observed[1], name  # KL clips, it never widens
    weights = {n: s for n, s in scales.items() if s.size > 1}
    assert weights and all(s.ndim == 1 for s in weights.values())  # --per-channel: one scale per channel


def test_cli_calibrate_bad_input(zoo, tmp_path, capsys):
    base = ["calibrate", str(zoo["fp32"]), "--out", str(tmp_path / "x.onnx")]
    assert main([*base, "--data", str(tmp_path / "missing.h5")]) == 2
    assert "missing.h5: dataset not found" in capsys.readouterr().err
    assert main([*base, "--data", str(zoo["data"]), "--percentiles", "99,1"]) == 2
    assert "percentiles must satisfy" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*base, "--data", str(zoo["data"]), "--method", "entropy"])
    assert exc.value.code == 2
    with pytest.raises(InputError, match="unknown calibration method"):
        CalibrationOptions(method="entropy")


RSS_SCRIPT = """
import json, resource, sys, logging
sys.path.insert(0, sys.argv[1])
logging.disable(logging.WARNING)
from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
from pytest_qaccuracy.runtime import RuntimeOptions
result = compute_ranges(
    sys.argv[2], sys.argv[3], CalibrationOptions(method="kl", bins=1001), RuntimeOptions(batch_size=4)
)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rss": rss, "records": result.records, "x": [float(v) for v in result.observed["x"]]}))
"""


def _calibrate_in_a_process(model: Path, data: Path) -> dict:
    """Peak RSS (kB), records calibrated and the input's observed (min, max) of a fresh process."""
    args = [sys.executable, "-c", RSS_SCRIPT, str(ROOT), str(model), str(data)]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_histogram_calibration_memory_is_flat_in_the_number_of_records(tmp_path):
    """16 vs 400 records of 3x64x64 (9 MB more data, 7 tensors): peak RSS must not follow."""
    import h5py
    import modelzoo

    model = modelzoo.conv_net(tmp_path / "big.onnx", size=64)
    rng = np.random.default_rng(0)
    sizes = {}
    for count in (16, 400):
        path = tmp_path / f"d{count}.h5"
        lo, hi = np.inf, -np.inf
        with h5py.File(path, "w") as f:
            for i in range(count):
                record = rng.standard_normal((3, 64, 64)).astype(np.float32)
                lo, hi = min(lo, float(record.min())), max(hi, float(record.max()))
                f.create_dataset(f"value/{i}/0", data=record)
        run = _calibrate_in_a_process(model, path)
        # flat memory must not come from skipping records: all were read, the extrema are the data's
        assert run["records"] == count and run["x"] == [lo, hi]
        sizes[count] = run["rss"]
    grown_mb = (sizes[400] - sizes[16]) / 1024
    # keeping every tensor would add >= 400 * 3*64*64*4 B = 19 MB for the input alone
    assert grown_mb < 8, f"peak RSS grew by {grown_mb:.1f} MB from 16 to 400 records"


@pytest.mark.parametrize("power2", [False, True])
def test_overrides_write_the_same_model_as_the_calibration_cache(zoo, tmp_path, power2):
    """The path for onnxruntime releases without calibration_cache_path gives the same model.

    Depends on the installed onnxruntime: where ``quantize_static`` has no ``calibration_cache_path``
    (1.18 has none), ``via="cache"`` is refused and ``auto`` must take the overrides.
    """
    import inspect

    from onnxruntime.quantization import quantize_static

    from pytest_qaccuracy.analysis.calibration import quantize_with_ranges

    options = CalibrationOptions(method="percentile", power2=power2, per_channel=power2)
    result = compute_ranges(zoo["fp32"], zoo["data"], options)
    if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
        a = quantize_with_ranges(zoo["fp32"], tmp_path / "cache.onnx", result, options, via="cache")
    else:
        with pytest.raises(InputError, match="takes no calibration_cache_path; use via='overrides'"):
            quantize_with_ranges(zoo["fp32"], tmp_path / "cache.onnx", result, options, via="cache")
        a = quantize_with_ranges(zoo["fp32"], tmp_path / "auto.onnx", result, options, via="auto")
    b = quantize_with_ranges(zoo["fp32"], tmp_path / "overrides.onnx", result, options, via="overrides")
    inits_a = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(a)).graph.initializer}
    inits_b = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(b)).graph.initializer}
    assert inits_a.keys() == inits_b.keys() and len(inits_a) > 20
    for name, value in inits_a.items():
        np.testing.assert_array_equal(value, inits_b[name], err_msg=name)
    with pytest.raises(InputError, match="unknown way"):
        quantize_with_ranges(zoo["fp32"], tmp_path / "x.onnx", result, options, via="telepathy")


@pytest.mark.parametrize("method", ["minmax", "percentile", "moving-average", "kl", "mse"])
def test_batches_capped_by_bytes_give_the_same_ranges(outliers, monkeypatch, method):
    """Batches shrink to stay under ``BATCH_BYTES`` of tensors (the first one is a single record): the
    ranges are those of any other batching, because every observer folds records independently."""
    from pytest_qaccuracy.analysis.calibration import calibrator
    from pytest_qaccuracy.runtime import RuntimeOptions

    seen: list[int] = []
    real = calibrator._passes

    def counting(*args, **kwargs):
        for values, count in real(*args, **kwargs):
            seen.append(count)
            yield values, count

    monkeypatch.setattr(calibrator, "_passes", counting)
    options = CalibrationOptions(method=method)
    whole = compute_ranges(outliers["fp32"], outliers["calib"], options, RuntimeOptions(batch_size=100))
    assert seen[:2] == [1, 99]  # one record measures a record's tensors (x, h, r: 32 floats; y: 10)
    seen.clear()
    monkeypatch.setattr(calibrator, "BATCH_BYTES", 3 * 4 * (3 * 32 + 10))  # room for 3 records
    capped = compute_ranges(outliers["fp32"], outliers["calib"], options, RuntimeOptions(batch_size=100))
    assert seen[:4] == [1, 3, 3, 3] and sum(seen) == (200 if method in ("kl", "mse") else 100)
    assert capped.ranges == whole.ranges and capped.records == whole.records == 100


def test_the_quantizer_reads_a_private_copy_of_the_model(outliers, tmp_path, monkeypatch):
    """onnxruntime's quantize_static writes ``<model>-inferred.onnx`` beside the file it is given and
    deletes it: calibrate hands it a private copy, so two calibrations of one model at once (xdist
    workers) never share that file."""
    import onnxruntime.quantization as q

    given: list[Path] = []
    real = q.quantize_static

    def spy(model_input, *args, **kwargs):
        given.append(Path(model_input))
        return real(model_input, *args, **kwargs)

    monkeypatch.setattr(q, "quantize_static", spy)
    calibrate(outliers["fp32"], outliers["calib"], tmp_path / "q.onnx", CalibrationOptions(method="minmax"))
    (path,) = given
    assert path.parent != outliers["fp32"].parent and path.name == outliers["fp32"].name
    assert onnx.load(str(tmp_path / "q.onnx")).graph.node  # and the model was written
