"""Benchmark: the emulated integer backend against onnxruntime and onnx.reference, side by side.

Builds a float conv net (``--convs`` 3x3 convs, residual adds, a pooled classifier head), quantizes it
with ``onnxruntime.quantization.quantize_static`` (QDQ uint8 activations, int8 per-channel weights,
opset 21 so that ``onnx.reference`` can run it, and a QOperator twin), then times one batch:

    python bench/integer_backend.py                  # 22 convs, batch 32, 32x32, 32 channels
    python bench/integer_backend.py --reference-records 4
    OPENBLAS_NUM_THREADS=1 python bench/integer_backend.py --threads 1   # one core for everyone

Each runtime runs the same quantized model on the same batch; the best of ``--repeat`` runs is reported
(onnx.reference: one run). ``--reference-records`` times onnx.reference on fewer records and scales
linearly to the batch (labelled "scaled" in the table). The integer backend runs this machine's
preset, whose outputs are checked bit for bit against onnxruntime's, and the other x86 family's
preset: the second table gives
the cost of emulating the int16 pair saturation of CPUs without VNNI (``onnxruntime-avx2``) against
exact int32 sums (``onnxruntime-vnni``); the third table the ARM64 presets (fixed-point
QLinearAdd, the int16 pair wrap check of CPUs without dot products) against the same exact path.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def conv_net(convs: int, channels: int, size: int, seed: int = 0) -> onnx.ModelProto:
    """``convs`` 3x3 convs with ReLU, a residual add every two convs, two stride-2 stages, a head."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current, skip = "input", "input"
    for i in range(convs):
        stride = 2 if i in (convs // 3, 2 * convs // 3) else 1
        w = rng.normal(0, (2.0 / (9 * channels)) ** 0.5, (channels, channels, 3, 3)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(channels, np.float32), f"b{i}")]
        nodes.append(
            helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], strides=[stride] * 2)
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        current = f"r{i}"
        if stride == 2:
            skip = current
        elif i % 2 == 1:
            nodes.append(helper.make_node("Add", [current, skip], [f"a{i}"]))
            current = skip = f"a{i}"
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, (channels, 10)).astype(np.float32), "fc"))
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bench_net",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def detector_net(
    size: int, widths: tuple[int, ...] = (8, 16, 32, 64), blocks: tuple[int, ...] = (4, 6, 6, 7)
) -> onnx.ModelProto:
    """A text-detector-like net: stride-2 stem, residual stages, nearest-upsampling head (53 convs)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(x: str, cin: int, cout: int, k: int = 3, stride: int = 1, relu: bool = True) -> str:
        i = len(inits) // 2
        w = rng.normal(0, (2.0 / (cin * k * k)) ** 0.5, (cout, cin, k, k)).astype(np.float32)
        inits.extend(
            [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        )
        nodes.append(
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[k // 2] * 4, strides=[stride] * 2)
        )
        if not relu:
            return f"c{i}"
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        return f"r{i}"

    x = conv("input", widths[0], widths[0], stride=2)
    features = []
    for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
        if stage:
            x = conv(x, widths[stage - 1], width, stride=2)
        for _ in range(count):
            y = conv(conv(x, width, width), width, width, relu=False)
            nodes.append(helper.make_node("Add", [x, y], [f"{y}_add"]))
            nodes.append(helper.make_node("Relu", [f"{y}_add"], [f"{y}_out"]))
            x = f"{y}_out"
        features.append((x, width))
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up"))
    x, width = features[-1]
    for skip, skip_width in reversed(features[:-1]):
        nodes.append(helper.make_node("Resize", [x, "", "up"], [f"{x}_up"], mode="nearest"))
        nodes.append(helper.make_node("Concat", [f"{x}_up", skip], [f"{x}_cat"], axis=1))
        x, width = conv(f"{x}_cat", width + skip_width, skip_width, k=1), skip_width
    x = conv(x, width, 1, k=1, relu=False)
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", widths[0], size, size])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def mobile_net(size: int) -> onnx.ModelProto:
    """``netzoo.mobile_detector`` (MobileNetV2-style, depthwise convs) at opset 21, input named ``input``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import netzoo

    with tempfile.TemporaryDirectory() as tmp:
        model = onnx.load(str(netzoo.mobile_detector(Path(tmp) / "mobile.onnx", size=size)))
    model.opset_import[0].version, model.ir_version = 21, 10
    model.graph.input[0].name = "input"
    for node in model.graph.node:
        node.input[:] = ["input" if name == "x" else name for name in node.input]
    return model


def quantize(model: onnx.ModelProto, calibration: np.ndarray, folder: Path, fmt: str) -> Path:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    class Reader:
        def __init__(self) -> None:
            self.items = iter([{"input": calibration[i : i + 8]} for i in range(0, len(calibration), 8)])

        def get_next(self) -> dict | None:
            return next(self.items, None)

    src, dst = folder / "float.onnx", folder / f"{fmt}.onnx"
    onnx.save(model, src)
    quantize_static(
        str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
        calibrate_method=CalibrationMethod.MinMax,
    )  # fmt: skip
    return dst


def best_of(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--net",
        choices=("plain", "detector", "mobile"),
        default="plain",
        help="plain, detector-like, or MobileNet-like",
    )
    parser.add_argument("--convs", type=int, default=22)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference-records", type=int, default=0, help="time onnx.reference on this many records")
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads of onnxruntime and the backend (0: all cores)"
    )
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)

    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    from pytest_qaccuracy.backend import IntegerSession

    if args.net == "detector":
        args.channels = 8  # the detector's stem takes 8 channels (an image already lifted by a first layer)
        net = detector_net(args.size)
        args.convs = sum(1 for n in net.graph.node if n.op_type == "Conv")
    elif args.net == "mobile":
        args.channels = 3
        net = mobile_net(args.size)
        args.convs = sum(1 for n in net.graph.node if n.op_type == "Conv")
    else:
        net = conv_net(args.convs, args.channels, args.size)
    rng = np.random.default_rng(1)
    calibration = rng.normal(0, 1, (32, args.channels, args.size, args.size)).astype(np.float32)
    batch = rng.normal(0, 1, (args.batch, args.channels, args.size, args.size)).astype(np.float32)
    folder = Path(tempfile.mkdtemp(prefix="qaccuracy-bench-"))
    versions = f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, numpy {np.__version__}"
    shape = f"{args.convs} convs, {args.channels} channels, {args.size}x{args.size}, batch {args.batch}"
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(
        f"net: {shape}; {os.cpu_count()} cores (ORT threads {args.threads or 'all'}, BLAS threads {blas}); {versions}"
    )
    rows, families = [], []
    print(f"host preset: {_host()}")
    for fmt in ("qdq", "qoperator"):
        path = quantize(net, calibration, folder, fmt)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.qdqisint8allowed", "1")
        options.intra_op_num_threads = args.threads
        ort_session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        integer = IntegerSession(path, "onnxruntime", threads=args.threads)  # this machine's preset
        other = IntegerSession(path, OTHER_FAMILY[integer.scheme.name], threads=args.threads)
        t_ort, want = best_of(lambda s=ort_session: s.run(None, {"input": batch}), args.repeat)
        t_int, got = best_of(lambda s=integer: s.run(None, {"input": batch}), args.repeat)
        t_other, _ = best_of(lambda s=other: s.run(None, {"input": batch}), args.repeat)
        times = {integer.scheme.name: t_int, other.scheme.name: t_other}
        for name in ARM64:  # the ARM64 presets, emulated here like the other x86 family
            arm = IntegerSession(path, name, threads=args.threads)
            times[name], _ = best_of(lambda s=arm: s.run(None, {"input": batch}), args.repeat)
        families.append((fmt, *(times[name] for name in ("onnxruntime-avx2", "onnxruntime-vnni", *ARM64))))
        mismatches = int(np.count_nonzero(np.asarray(got[0]) != np.asarray(want[0])))
        t_ref, note = float("nan"), "cannot run (com.microsoft / opset-10 QOperator kernels)"
        if fmt == "qdq":
            n = args.reference_records or args.batch
            reference = ReferenceEvaluator(str(path))
            t_sub, _ = best_of(lambda r=reference, n=n: r.run(None, {"input": batch[:n]}), 1)
            t_ref = t_sub * args.batch / n
            note = "measured" if n == args.batch else f"scaled from {n} records"
        rows.append((fmt, t_ort, t_int, t_ref, mismatches, note))
    print(
        "\n| model | onnxruntime | integer backend | onnx.reference | integer / ort | reference / integer "
        "| output mismatches |"
    )
    print("|---|---|---|---|---|---|---|")
    for fmt, t_ort, t_int, t_ref, mismatches, note in rows:
        ref = f"{t_ref * 1000:.0f} ms ({note})" if t_ref == t_ref else note
        speedup = f"{t_ref / t_int:.1f}x" if t_ref == t_ref else "-"
        print(
            f"| {fmt} | {t_ort * 1000:.1f} ms | {t_int * 1000:.1f} ms | {ref} | {t_int / t_ort:.1f}x | {speedup} "
            f"| {mismatches} |"
        )
    print("\n| model | onnxruntime-avx2 (pairs saturate) | onnxruntime-vnni (exact) | avx2 / vnni |")
    print("|---|---|---|---|")
    for fmt, t_avx2, t_vnni, *_ in families:
        print(f"| {fmt} | {t_avx2 * 1000:.1f} ms | {t_vnni * 1000:.1f} ms | {t_avx2 / t_vnni:.2f}x |")
    print("\n| model | onnxruntime-arm64 | onnxruntime-arm64-neon | arm64 / vnni (exact) | arm64-neon / vnni |")
    print("|---|---|---|---|---|")
    for fmt, _, t_vnni, t_arm, t_neon in families:
        ratios = f"{t_arm / t_vnni:.2f}x | {t_neon / t_vnni:.2f}x"
        print(f"| {fmt} | {t_arm * 1000:.1f} ms | {t_neon * 1000:.1f} ms | {ratios} |")


OTHER_FAMILY = {"onnxruntime-avx2": "onnxruntime-vnni", "onnxruntime-vnni": "onnxruntime-avx2"}
ARM64 = ("onnxruntime-arm64", "onnxruntime-arm64-neon")


def _host() -> str:
    from pytest_qaccuracy.backend.host import host_preset

    return host_preset()


if __name__ == "__main__":
    main()
