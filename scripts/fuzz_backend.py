"""Random integer models through the emulation and this machine's onnxruntime, bit for bit.

Each case draws an operator, types, shapes, attributes, scales and zero points, runs the one-node
model (families ``gemm`` and ``elementwise``) or the QDQ group around one float op (``qdq``: what
quantizers write, fused by both into integer kernels) in onnxruntime and in ``IntegerSession`` with
the preset named, and compares the outputs (or that both refuse it). Run it on the CPU family whose
preset you name: natively, or under qemu-user as ``.ci/avx2`` and ``.ci/arm64`` do (a preset checked
against another family's onnxruntime differs by design).

    python scripts/fuzz_backend.py --preset onnxruntime-vnni --cases 500 --seed 1
    python scripts/fuzz_backend.py --preset onnxruntime --family elementwise   # the host's family
    python scripts/fuzz_backend.py --family qdq --int8-allowed    # QDQ groups, int8 kept as int8

Prints each case that differs (with its index: ``--seed S --only I`` runs it again) and a count per
operator; exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_qaccuracy.backend import IntegerSession
from pytest_qaccuracy.backend.host import host_preset
from pytest_qaccuracy.backend.scheme import get_scheme

MS = "com.microsoft"
Case = tuple[str, list[str], dict[str, np.ndarray], dict[str, np.ndarray], dict[str, object], type]
#: what a case runs: its label, the model, the feeds and a description of its attributes and types
Built = tuple[str, onnx.ModelProto, dict[str, np.ndarray], str]


class Draw:
    """The random choices of one case."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def ints(self, shape: tuple[int, ...] | int, dtype: type) -> np.ndarray:
        info = np.iinfo(dtype)
        return self.rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)

    def scale(self, shape: tuple[int, ...] | int = ()) -> np.ndarray:
        return np.exp(self.rng.uniform(np.log(1e-3), np.log(1.0), shape)).astype(np.float32)

    def shape(self, low: int = 1, high: int = 9, rank: tuple[int, int] = (1, 5)) -> tuple[int, ...]:
        return tuple(int(v) for v in self.rng.integers(low, high, int(self.rng.integers(*rank))))

    def types(self) -> tuple[type, type]:
        """Activations and weights: onnxruntime has no int8 x uint8 kernels."""
        x = np.uint8 if self.rng.random() < 0.5 else np.int8
        return x, (np.int8 if x == np.int8 or self.rng.random() < 0.8 else np.uint8)

    def weight_zero_point(self, dtype: type, channels: int | None) -> np.ndarray:
        shape = () if channels is None else (channels,)
        return np.zeros(shape, dtype) if dtype == np.int8 else self.ints(shape, dtype)


def conv(d: Draw) -> Case:
    xt, wt = d.types()
    rank = 2 if d.rng.random() < 0.85 else 1
    c = int(d.rng.integers(1, 20))
    group = c if d.rng.random() < 0.3 else 1
    m = c * int(d.rng.integers(1, 3)) if group > 1 else int(d.rng.integers(1, 20))
    kernel = tuple(int(v) for v in d.rng.integers(1, 4, rank))
    spatial = tuple(max(int(v), k) for v, k in zip(d.rng.integers(1, 12, rank), kernel, strict=True))
    attrs = {
        "group": group,
        "strides": [int(v) for v in d.rng.integers(1, 3, rank)],
        "pads": [int(v) for v in d.rng.integers(0, 2, 2 * rank)],
    }
    per_channel = m if d.rng.random() < 0.5 else None
    feeds = {"x": d.ints((int(d.rng.integers(1, 4)), c, *spatial), xt)}
    inits = {
        "xs": d.scale(), "xz": d.ints((), xt), "w": d.ints((m, c // group, *kernel), wt),
        "ws": d.scale(per_channel or ()), "wz": d.weight_zero_point(wt, per_channel),
        "ys": d.scale(), "yz": d.ints((), xt),
    }  # fmt: skip
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if d.rng.random() < 0.5:
        inits["b"] = d.rng.integers(-30000, 30000, m).astype(np.int32)
        names.append("b")
    return "QLinearConv", names, feeds, inits, attrs, xt


def conv_integer(d: Draw) -> Case:
    _, _, feeds, inits, attrs, _ = conv(d)
    wz = inits["wz"].reshape(-1)[:1].reshape(())  # one zero point in onnxruntime's ConvInteger
    return "ConvInteger", ["x", "w", "xz", "wz"], feeds, {"w": inits["w"], "xz": inits["xz"], "wz": wz}, attrs, np.int32


def matmul(d: Draw) -> Case:
    xt, wt = d.types()
    m, k, n = (int(v) for v in d.rng.integers(1, 40, 3))
    per_channel = n if d.rng.random() < 0.5 else None
    feeds = {"x": d.ints((*d.shape(rank=(0, 3), high=4), m, k), xt)}
    inits = {
        "xs": d.scale(), "xz": d.ints((), xt), "b": d.ints((k, n), wt), "bs": d.scale(per_channel or ()),
        "bz": d.weight_zero_point(wt, per_channel), "ys": d.scale(), "yz": d.ints((), xt),
    }  # fmt: skip
    return "QLinearMatMul", ["x", "xs", "xz", "b", "bs", "bz", "ys", "yz"], feeds, inits, {}, xt


def matmul_integer(d: Draw) -> Case:
    _, _, feeds, inits, _, _ = matmul(d)
    n = inits["b"].shape[1]
    bz = d.ints((n,) if d.rng.random() < 0.5 else (), inits["b"].dtype.type)
    return "MatMulInteger", ["x", "b", "xz", "bz"], feeds, {"b": inits["b"], "xz": inits["xz"], "bz": bz}, {}, np.int32


def gemm(d: Draw) -> Case:
    xt, wt = d.types()
    m, k, n = (int(v) for v in d.rng.integers(1, 40, 3))
    transposed = int(d.rng.integers(0, 2))
    per_channel = n if d.rng.random() < 0.5 else None
    feeds = {"x": d.ints((m, k), xt)}
    inits = {
        "as": d.scale(), "az": d.ints((), xt), "b": d.ints((n, k) if transposed else (k, n), wt),
        "bs": d.scale(per_channel or ()), "bz": d.weight_zero_point(wt, per_channel),
        "ys": d.scale(), "yz": d.ints((), xt),
    }  # fmt: skip
    names = ["x", "as", "az", "b", "bs", "bz", "", "ys", "yz"]
    if d.rng.random() < 0.5:
        inits["c"] = d.rng.integers(-30000, 30000, n).astype(np.int32)
        names[6] = "c"
    return "QGemm", names, feeds, inits, {"transB": transposed, "alpha": float(d.rng.choice([1.0, 0.5, 2.0]))}, xt


def binary(op: str) -> Callable[[Draw], Case]:
    def make(d: Draw) -> Case:
        t = d.types()[0]
        a = d.shape()
        if d.rng.random() < 0.3:
            b: tuple[int, ...] = (1,)
        elif d.rng.random() < 0.5:
            b = a[int(d.rng.integers(0, len(a))) :]
        else:
            b = tuple(1 if d.rng.random() < 0.4 else v for v in a)
        feeds = {"a": d.ints(a, t), "b": d.ints(b, t)}
        inits = {
            "as": d.scale(),
            "az": d.ints((), t),
            "bs": d.scale(),
            "bz": d.ints((), t),
            "ys": d.scale(),
            "yz": d.ints((), t),
        }
        return op, ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], feeds, inits, {}, t

    return make


def unary(op: str) -> Callable[[Draw], Case]:
    def make(d: Draw) -> Case:
        t = d.types()[0]
        feeds = {"x": d.ints(d.shape(), t)}
        inits = {"xs": d.scale(), "xz": d.ints((), t), "ys": d.scale(), "yz": d.ints((), t)}
        attrs: dict[str, object] = {}
        if op == "QLinearLeakyRelu":
            attrs = {"alpha": float(d.rng.uniform(0.01, 0.5))}
        if op == "QLinearSoftmax":  # the quantizer's 1/256 (QOperator), a calibrated [0, 1], or any
            low = np.array(0 if t == np.uint8 else -128, t)
            kind = int(d.rng.integers(0, 3))
            if kind < 2:
                inits["ys"], inits["yz"] = np.float32(1 / 256 if kind == 0 else 1 / 255), low
            else:  # fine scales: quotients past the type's range, and float32 overflow on short rows
                inits["ys"] = np.float32(np.exp(d.rng.uniform(np.log(1e-4), np.log(0.05))))
            attrs = {"axis": -1, "opset": 13}
        return op, ["x", "xs", "xz", "ys", "yz"], feeds, inits, attrs, t

    return make


def pool(op: str) -> Callable[[Draw], Case]:
    def make(d: Draw) -> Case:
        t = d.types()[0]
        shape = tuple(
            int(v) for v in (d.rng.integers(1, 3), d.rng.integers(1, 6), d.rng.integers(2, 9), d.rng.integers(2, 9))
        )
        feeds = {"x": d.ints(shape, t)}
        inits = {"xs": d.scale(), "xz": d.ints((), t), "ys": d.scale(), "yz": d.ints((), t)}
        attrs: dict[str, object] = {"channels_last": 0}
        if op == "QLinearAveragePool":
            kernel = [int(v) for v in d.rng.integers(1, 4, 2)]
            attrs = {
                "kernel_shape": kernel,
                "strides": [int(v) for v in d.rng.integers(1, 3, 2)],
                "pads": [int(d.rng.integers(0, k)) for k in kernel] * 2,
                "count_include_pad": int(d.rng.integers(0, 2)),
            }
        return op, ["x", "xs", "xz", "ys", "yz"], feeds, inits, attrs, t

    return make


def concat(d: Draw) -> Case:
    t = d.types()[0]
    base = list(d.shape())
    axis = int(d.rng.integers(0, len(base)))
    names, feeds, inits = ["ys", "yz"], {}, {"ys": d.scale(), "yz": d.ints((), t)}
    for j in range(int(d.rng.integers(1, 4))):
        shape = list(base)
        shape[axis] = int(d.rng.integers(1, 5))
        feeds[f"x{j}"] = d.ints(tuple(shape), t)
        same = d.rng.random() < 0.3  # copied, not requantized
        inits[f"s{j}"] = inits["ys"] if same else d.scale()
        inits[f"z{j}"] = inits["yz"] if same else d.ints((), t)
        names += [f"x{j}", f"s{j}", f"z{j}"]
    return "QLinearConcat", names, feeds, inits, {"axis": axis}, t


class QDQGraph:
    """A float graph of QuantizeLinear / DequantizeLinear pairs around one float op, as quantizers write
    them: onnxruntime fuses the groups into its integer kernels, the emulation into its own."""

    def __init__(self, d: Draw, activations: type):
        self.d, self.type = d, activations
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}

    def dequantize(self, q: str, out: str, scale: np.ndarray, zero: np.ndarray, axis: int | None = None) -> str:
        self.inits[out + "_s"], self.inits[out + "_z"] = scale, zero
        attrs = {} if axis is None else {"axis": axis}
        self.nodes.append(helper.make_node("DequantizeLinear", [q, out + "_s", out + "_z"], [out], **attrs))
        return out

    def round_trip(self, x: str, out: str, scale: np.ndarray | None = None, zero: np.ndarray | None = None) -> str:
        """``x`` quantized and dequantized: a fresh scale and zero point unless given."""
        scale = self.d.scale() if scale is None else scale
        zero = self.d.ints((), self.type) if zero is None else zero
        self.inits[out + "_qs"], self.inits[out + "_qz"] = scale, zero
        self.nodes.append(helper.make_node("QuantizeLinear", [x, out + "_qs", out + "_qz"], [out + "_q"]))
        return self.dequantize(out + "_q", out, scale, zero)

    def weight(self, shape: tuple[int, ...], axis: int | None) -> str:
        """int8 weights, per tensor or per channel along ``axis`` (zero points 0, as onnxruntime writes them)."""
        channels = () if axis is None else (shape[axis],)
        self.inits["w"] = self.d.ints(shape, np.int8)
        return self.dequantize("w", "w_d", self.d.scale(channels), np.zeros(channels, np.int8), axis)

    def bias(self, x_scale: np.ndarray, w_scale: np.ndarray, channels: int) -> str:
        """int32 bias at the scale ``x_s * w_s``, as onnxruntime's quantizer writes it."""
        self.inits["b"] = self.d.rng.integers(-5000, 5000, channels).astype(np.int32)
        scale = (x_scale * w_scale * np.ones(channels)).astype(np.float32)
        return self.dequantize("b", "b_d", scale, np.zeros(channels, np.int32), 0)

    def model(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs: object) -> onnx.ModelProto:
        self.nodes.append(helper.make_node(op, inputs, ["y"], **attrs))
        same = op in ("MaxPool", "Relu") and self.d.rng.random() < 0.5  # onnxruntime drops a Q that changes nothing
        x_scale, x_zero = self.inits["x_d_qs"], self.inits["x_d_qz"]
        self.round_trip("y", "out", *((x_scale, x_zero) if same else ()))
        graph = helper.make_graph(
            self.nodes,
            op,
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.asarray(v), k) for k, v in self.inits.items()],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def qdq(op: str) -> Callable[[Draw], Built]:
    def make(d: Draw) -> Built:
        t = d.types()[0]
        g = QDQGraph(d, t)
        attrs: dict[str, object] = {}
        if op == "Conv":
            c, m = (int(v) for v in d.rng.integers(1, 12, 2))
            k = int(d.rng.integers(1, 4))
            side = int(d.rng.integers(k, 10))
            shape: tuple[int, ...] = (int(d.rng.integers(1, 3)), c, side, side)
            attrs = {"pads": [int(v) for v in d.rng.integers(0, 2, 4)], "strides": [int(d.rng.integers(1, 3))] * 2}
        elif op in ("MatMul", "Gemm"):
            k, n = (int(v) for v in d.rng.integers(1, 30, 2))
            shape = (int(d.rng.integers(1, 10)), k)
        elif op in ("AveragePool", "GlobalAveragePool", "MaxPool"):
            shape = tuple(int(v) for v in (d.rng.integers(1, 3), d.rng.integers(1, 6), *d.rng.integers(2, 8, 2)))
            if op != "GlobalAveragePool":
                attrs = {"kernel_shape": [2, 2]}
            if op == "AveragePool":
                attrs |= {"pads": [int(d.rng.integers(0, 2))] * 4, "count_include_pad": int(d.rng.integers(0, 2))}
        else:
            shape = d.shape(high=6, rank=(1, 4))
        x = g.round_trip("x", "x_d")
        inputs = [x]
        if op in ("Conv", "MatMul", "Gemm"):
            per_channel = d.rng.random() < 0.5
            if op == "Conv":
                inputs.append(g.weight((m, c, k, k), 0 if per_channel else None))
                channels = m
            else:
                inputs.append(g.weight((k, n), 1 if per_channel else None))
                channels = n
            if op != "MatMul" and d.rng.random() < 0.5:
                inputs.append(g.bias(g.inits["x_d_qs"], g.inits["w_d_s"], channels))
        elif op in ("Add", "Mul", "Concat"):
            other = shape[int(d.rng.integers(0, len(shape))) :] if op != "Concat" else shape
            g.inits["c"] = d.ints(other, t)
            inputs.append(g.dequantize("c", "c_d", d.scale(), d.ints((), t)))
            if op == "Concat":
                attrs = {"axis": int(d.rng.integers(0, len(shape)))}
        x_value = d.rng.normal(0, 1, shape).astype(np.float32)
        return f"{op} (QDQ)", g.model(op, inputs, shape, **attrs), {"x": x_value}, f"{t.__name__} {attrs}"

    return make


def node(maker: Callable[[Draw], Case]) -> Callable[[Draw], Built]:
    """A one-node case as a model."""

    def make(d: Draw) -> Built:
        case = maker(d)
        return case[0], one_node(case), case[2], str(case[4])

    return make


QDQ_OPS = (
    "Conv",
    "MatMul",
    "Gemm",
    "Add",
    "Mul",
    "AveragePool",
    "GlobalAveragePool",
    "MaxPool",
    "Sigmoid",
    "Concat",
    "Relu",
)
FAMILIES: dict[str, dict[str, Callable[[Draw], Built]]] = {
    "gemm": {
        "conv": node(conv),
        "conv_integer": node(conv_integer),
        "matmul": node(matmul),
        "matmul_integer": node(matmul_integer),
        "gemm": node(gemm),
    },
    "elementwise": {
        "add": node(binary("QLinearAdd")),
        "mul": node(binary("QLinearMul")),
        "sigmoid": node(unary("QLinearSigmoid")),
        "leaky_relu": node(unary("QLinearLeakyRelu")),
        "softmax": node(unary("QLinearSoftmax")),
        "average_pool": node(pool("QLinearAveragePool")),
        "global_average_pool": node(pool("QLinearGlobalAveragePool")),
        "concat": node(concat),
    },
    "qdq": {f"qdq_{op.lower()}": qdq(op) for op in QDQ_OPS},
}


def one_node(case: Case) -> onnx.ModelProto:
    op, names, feeds, inits, attrs, out_type = case
    domain = "" if op in ("QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger") else MS
    tensor = helper.np_dtype_to_tensor_dtype
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], domain=domain, **attrs)],
        op,
        [helper.make_tensor_value_info(k, tensor(v.dtype), v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info("y", tensor(np.dtype(out_type)), None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], preset: str, int8_allowed: bool
) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """onnxruntime's output and the emulation's (None where one refuses the model), and onnxruntime's
    refusal ("" where it ran the model)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    scheme = get_scheme(preset)
    if int8_allowed:  # int8 QDQ groups fused as they are, not turned into uint8 first
        options.add_session_config_entry("session.qdqisint8allowed", "1")
        scheme = scheme.replace(name=scheme.name, qdq_int8_to_uint8=False)
    want, refusal = None, ""
    try:
        want = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
            None, feeds
        )[0]
    except Exception as error:  # a refusal is an outcome to compare
        refusal = str(error)
    try:
        got = IntegerSession(model, scheme=scheme).run(None, feeds)[0]
    except Exception:
        got = None
    return want, got, refusal


#: what older onnxruntime releases refuse and later ones run: ConvInteger with int8 operands (1.18 to
#: 1.23), QLinearConv with per-channel weight zero points that differ (1.18: "must be same"). The
#: emulation runs such models as later releases do (the arithmetic is the same); counted apart, not as
#: a difference.
NOT_IMPLEMENTED = ("NOT_IMPLEMENTED", "zero point of per-channel filter must be same")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="onnxruntime", help="the emulation's preset (default: the host's)")
    parser.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=int, help="run only the case of this index")
    parser.add_argument("--int8-allowed", action="store_true", help="session.qdqisint8allowed=1 in both")
    args = parser.parse_args(argv)
    makers = {k: v for f, ops in FAMILIES.items() if args.family in (f, "all") for k, v in ops.items()}
    names = sorted(makers)
    compared, refused, differ, missing = Counter(), Counter(), Counter(), Counter()
    for index in range(args.cases):
        rng = np.random.default_rng([args.seed, index])
        draw = Draw(rng)
        op, model, feeds, detail = makers[names[int(rng.integers(0, len(names)))]](draw)
        if args.only is not None and index != args.only:
            continue
        want, got, refusal = run(model, feeds, args.preset, args.int8_allowed)
        if want is None and got is None:
            refused[op] += 1
            continue
        if any(text in refusal for text in NOT_IMPLEMENTED):
            missing[op] += 1
            continue
        same = want is not None and got is not None and want.shape == got.shape and want.dtype == got.dtype
        same = same and np.array_equal(want, got)
        compared[op] += 1
        if not same:
            differ[op] += 1
            what = (
                "refused by one" if want is None or got is None else f"{int((want != got).sum())} of {want.size} values"
            )
            shapes = {k: v.shape for k, v in feeds.items()}
            print(f"case {index}: {op} {shapes} {detail}: {what} differ (--seed {args.seed} --only {index})")
    for op in sorted(set(compared) | set(refused) | set(missing)):
        beyond = f", {missing[op]} not implemented by onnxruntime {ort.__version__}" if missing[op] else ""
        print(f"{op}: {compared[op]} compared, {differ[op]} differ, {refused[op]} refused by both{beyond}")
    preset = args.preset if args.preset != "onnxruntime" else f"onnxruntime (here {host_preset()})"
    print(f"{preset}: {sum(compared.values())} cases compared, {sum(differ.values())} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
