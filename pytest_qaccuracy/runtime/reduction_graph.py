"""Per-record statistics of matched tensor pairs, computed inside onnxruntime by one graph.

A layer-wise comparison needs, per record and matched tensor, a few sums over ``f - deq(q)`` (the
:class:`~pytest_qaccuracy.metrics.pair.RecordStats` fields). Copying every activation of both models
into numpy costs more than the inference itself, so :class:`ReducedRunner` runs one graph that
holds both models and reduces each pair to those few numbers where the tensors are:

1. Each model is optimized on its own, exactly as the plain runner's session would be (the same
   tensors exposed as graph outputs, the same level, the same batch relaxation), and saved by
   onnxruntime: its fusions are decided on the same graph, so the captured values are the plain
   runs' values.
2. The two saved graphs are merged: every name prefixed (``f/``, ``q/``) but the shared inputs;
   opset imports unified per domain where no op used changes meaning between the two versions,
   else the lower model converted by onnx's version converter (:func:`same_opsets`).
3. Reduction nodes are added and ordered so that both models advance layer by layer with each
   layer's reductions right after; the merged session runs in that order with optimizations off
   (nothing is fused anew). Only the per-record statistics, a few shapes and the tensors still
   wanted whole (outputs, tensors of custom metrics) are fetched.

Sums are float32 partial sums over blocks of at most :data:`BLOCK` elements of a record, added in
float64 by the caller; extremes and counts are exact. Where the merged graph cannot be built,
:class:`ReductionUnavailable` says why and the caller runs the plain path.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pytest_qaccuracy.data.binding import Batch, join_records
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.model.graph import node_reads
from pytest_qaccuracy.model.quant_params import QuantParams
from pytest_qaccuracy.ort_session import fetch, first_line, make_session, spin_during_run
from pytest_qaccuracy.runtime.options import RuntimeOptions
from pytest_qaccuracy.runtime.ort_runner import BatchUnits, _batch_dims, _close, _with_outputs, bakes_batch

FP32_PREFIX, QUANT_PREFIX, STAT_PREFIX = "f/", "q/", "qaccuracy/"


class ReductionUnavailable(Exception):
    """The merged graph cannot be built or run; the message says why (shown to the user)."""


@dataclass(slots=True)
class ReductionSpec:
    """One tensor pair to reduce in the graph.

    ``fields`` are RecordStats fields; ``steps`` asks for per-record max |f - q| / scale with a
    per-channel scale; ``bounds`` (float64 ``low``, ``high``, shaped to broadcast) asks for the count
    of fp32 values with ``f < low`` or ``f >= high``; ``spans`` asks for per-channel min and max
    along axes 1..3.
    """

    fp32: str
    capture: str
    params: QuantParams | None
    dims: tuple[int, ...]  # the static shape of a record (axes 1..)
    q_type: int  # the quantized tensor's ONNX element type
    fields: frozenset[str]
    steps: bool = False
    bounds: tuple[np.ndarray, np.ndarray] | None = None
    spans: bool = False
    outputs: dict[str, str] = field(default_factory=dict)  # statistic -> graph output name
    sum_fields: tuple[str, ...] = ()  # the fields stacked in the ``sums`` output, in order
    check_shapes: bool = True  # fetch the quantized tensor's shape (not statically the fp32 one's)
    cross: bool = False  # sum f(f - q) and derive sum q^2 from it (see CROSS)


def float32_at_least(value: np.ndarray) -> np.ndarray:
    """The smallest float32 >= each float64 value: for float32 ``f``, ``f < v`` iff ``f < result``."""
    value = np.asarray(value, dtype=np.float64)
    with np.errstate(over="ignore"):
        out = value.astype(np.float32)
    below = out.astype(np.float64) < value
    return np.where(below, np.nextafter(out, np.float32(np.inf)), out).astype(np.float32)


# -- merging two models ---------------------------------------------------------------------------


def _rename_graph(graph: onnx.GraphProto, prefix: str, keep: set[str]) -> None:
    """Prefix every non-empty name in ``graph`` and its subgraphs, except those in ``keep``."""

    def new(name: str) -> str:
        return name if not name or name in keep else prefix + name

    for value in [*graph.input, *graph.output, *graph.value_info]:
        value.name = new(value.name)
    for tensor in graph.initializer:
        tensor.name = new(tensor.name)
    for sparse in graph.sparse_initializer:
        sparse.values.name = new(sparse.values.name)
        sparse.indices.name = new(sparse.indices.name)
    for node in graph.node:
        node.name = prefix + node.name if node.name else ""
        node.input[:] = [new(x) for x in node.input]
        node.output[:] = [new(x) for x in node.output]
        for attr in node.attribute:
            if attr.HasField("g"):
                _rename_graph(attr.g, prefix, keep)
            for sub in attr.graphs:
                _rename_graph(sub, prefix, keep)


def _domain_nodes(graph: onnx.GraphProto, domain: str) -> list[onnx.NodeProto]:
    found = []
    for node in graph.node:
        if (node.domain or "") == domain:
            found.append(node)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                found.extend(_domain_nodes(sub, domain))
    return found


def _same_meaning(nodes: list[onnx.NodeProto], domain: str, low: int, high: int) -> str | None:
    """None when every node's op has the same definition at opset ``low`` and ``high``, else why not."""
    for node in nodes:
        try:
            a = onnx.defs.get_schema(node.op_type, low, domain).since_version
            b = onnx.defs.get_schema(node.op_type, high, domain).since_version
        except Exception:
            return f"{node.op_type} of domain '{domain or 'ai.onnx'}' is unknown to onnx at versions {low} and {high}"
        if a != b:
            return f"{node.op_type} changes between opset {low} and {high}"
    return None


def merged_opsets(f: onnx.ModelProto, q: onnx.ModelProto) -> dict[str, int]:
    """One opset version per domain for a graph holding both models.

    Where the versions differ, the higher one is taken if every op the lower model uses from that
    domain means the same there; else :class:`ReductionUnavailable`.
    """
    fv = {o.domain or "": o.version for o in f.opset_import}
    qv = {o.domain or "": o.version for o in q.opset_import}
    out = {}
    for domain in dict.fromkeys([*fv, *qv]):
        a, b = fv.get(domain), qv.get(domain)
        if a is None or b is None or a == b:
            out[domain] = a if b is None else b
            continue
        low_model = f if a < b else q
        why = _same_meaning(_domain_nodes(low_model.graph, domain), domain, min(a, b), max(a, b))
        if why:
            raise ReductionUnavailable(f"the models import different versions of '{domain or 'ai.onnx'}': {why}")
        out[domain] = max(a, b)
    return out


def same_opsets(f: onnx.ModelProto, q: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``f`` and ``q`` with opset imports that merge (see :func:`merged_opsets`): where an op the
    lower default-domain model uses changes meaning, that model is converted to the higher opset by
    onnx's version converter (its adapters keep the semantics: Softmax's axis, Squeeze's axes, ...)."""
    try:
        merged_opsets(f, q)
        return f, q
    except ReductionUnavailable as exc:
        reason = str(exc)
    fv = next((o.version for o in f.opset_import if (o.domain or "") == ""), 0)
    qv = next((o.version for o in q.opset_import if (o.domain or "") == ""), 0)
    if fv == qv or not fv or not qv:
        raise ReductionUnavailable(reason)
    try:
        from onnx import version_converter

        if fv < qv:
            f = version_converter.convert_version(f, qv)
        else:
            q = version_converter.convert_version(q, fv)
        merged_opsets(f, q)
    except Exception as exc:
        raise ReductionUnavailable(f"{reason}, and onnx cannot convert it ({first_line(exc)})") from None
    return f, q


def merge_models(f: onnx.ModelProto, q: onnx.ModelProto, inputs: Sequence[str]) -> onnx.ModelProto:
    """One model running ``f`` (names prefixed ``f/``) and ``q`` (``q/``) on the shared ``inputs``;
    no graph outputs (the caller adds what it fetches)."""
    opsets = merged_opsets(f, q)
    keys = {(fn.domain, fn.name): fn for fn in f.functions}
    for fn in q.functions:
        other = keys.get((fn.domain, fn.name))
        if other is not None and other.SerializeToString() != fn.SerializeToString():
            raise ReductionUnavailable(f"both models define a different local function {fn.domain}:{fn.name}")
        keys[(fn.domain, fn.name)] = fn
    keep = set(inputs)
    graphs = []
    for model, prefix in ((f, FP32_PREFIX), (q, QUANT_PREFIX)):
        graph = onnx.GraphProto()
        graph.CopyFrom(model.graph)
        _rename_graph(graph, prefix, keep)
        graphs.append(graph)
    merged = onnx.GraphProto(name="qaccuracy_pair")
    init = {t.name for g in graphs for t in g.initializer}
    for name in inputs:
        value = next(v for v in f.graph.input if v.name == name)
        merged.input.append(value)
    for graph in graphs:
        merged.input.extend(v for v in graph.input if v.name in init)  # initializers listed as inputs (IR < 4)
        merged.initializer.extend(graph.initializer)
        merged.sparse_initializer.extend(graph.sparse_initializer)
        merged.node.extend(graph.node)
        merged.value_info.extend(graph.value_info)
    model = helper.make_model(
        merged, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()], producer_name="pytest-qaccuracy"
    )
    model.ir_version = max(f.ir_version, q.ir_version)
    model.functions.extend(keys.values())
    return model


# -- reduction nodes ------------------------------------------------------------------------------


class _Builder:
    """Appends nodes and constants to a graph, written for its default-domain opset."""

    def __init__(
        self, graph: onnx.GraphProto, opset: int, inputs: Sequence[str], parent: _Builder | None = None
    ) -> None:
        self.graph, self.opset, self._parent, self._count = graph, opset, parent, 0
        self.inputs = set(inputs)
        self._ints: dict[tuple[int, ...], str] = {}

    def scoped(self, prefix: str, name: str) -> str:
        """A tensor's name in the merged graph (the shared inputs keep theirs)."""
        return name if name in self.inputs else prefix + name

    def name(self, hint: str) -> str:
        """A new unique name (a subgraph's builder counts with its parent's)."""
        if self._parent is not None:
            return self._parent.name(hint)
        self._count += 1
        return f"{STAT_PREFIX}{self._count}/{hint}"

    def node(self, op: str, inputs: list[str], hint: str, **attrs) -> str:
        out = self.name(hint)
        node = self.graph.node.add(op_type=op, name=out, input=inputs, output=[out])
        for key, value in sorted(attrs.items()):
            if isinstance(value, int):  # the common case, without onnx.helper's type dispatch
                node.attribute.add(name=key, type=onnx.AttributeProto.INT, i=value)
            else:
                node.attribute.append(helper.make_attribute(key, value))
        return out

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.name(hint)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, values: Sequence[int]) -> str:
        """An int64 vector constant (axes, shapes, slice bounds), one per value in the whole graph:
        subgraphs read it from the outer scope."""
        if self._parent is not None:
            return self._parent.ints(values)
        key = tuple(int(v) for v in values)
        if key not in self._ints:
            self._ints[key] = self.const(np.array(key, np.int64), "ints")
        return self._ints[key]

    def reduce(self, op: str, x: str, axes: Sequence[int], hint: str, keepdims: int = 0) -> str:
        """``op`` over ``axes``; axes as an input where the opset wants one (ReduceSum from 13, the rest from 18)."""
        if self.opset >= (13 if op == "ReduceSum" else 18):
            return self.node(op, [x, self.ints(axes)], hint, keepdims=keepdims)
        return self.node(op, [x], hint, axes=list(axes), keepdims=keepdims)

    def cast(self, x: str, to: int) -> str:
        return self.node("Cast", [x], "cast", to=to)


#: Elements per float32 partial sum at most: onnxruntime's sums of a row are float32, so their error
#: grows with the row (1024: within 6.9e-6 of the whole-tensor path's sums on the corpus models;
#: 4096 was about five times further off); the partial sums are added in float64 by the caller.
BLOCK = 1024


def _block(dims: Sequence[int]) -> int:
    """Elements per partial sum: the largest divisor of the record's size within BLOCK (blocks of a
    flattened record), unless the record's trailing dims give a larger one; at least the last dim
    when nothing smaller divides well (onnxruntime's float32 sums run sequentially: shorter is
    more precise)."""
    count = int(np.prod(dims))
    size = dims[-1]
    for d in reversed(dims[:-1]):
        if size * d > BLOCK:
            break
        size *= d
    best = max((d for d in _divisors(count) if d <= BLOCK), default=1)
    return best if best > size or (size > BLOCK and best >= MIN_BLOCK) else size


#: The shortest partial sum taken when a record's last axis is longer than BLOCK.
MIN_BLOCK = 256


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return small + [n // d for d in small]


#: Cosine reads 1 - cos from ||f|| - ||q||: taken from independent sums of f^2 and q^2, an error e
#: in either grows by about ||f|| / ||f - q|| (100x at 40 dB SQNR). With ``cross`` the graph sums
#: f * (f - q) instead of q^2, and sum q^2 = sum f^2 - 2 sum f(f - q) + sum (f - q)^2 makes
#: ||f||^2 - ||q||^2 exact given the two small sums: 1 - cos keeps the precision of the sums.
CROSS = "cross"

#: The RecordStats sums, in the order their partial sums are stacked in a spec's ``sums`` output:
#: (field, elementwise op on the source, source). Squares and magnitudes are taken by Mul and Abs,
#: then summed by ReduceSum: onnxruntime's ReduceSumSquare and ReduceL1 have no vectorized path and
#: cost about twice as much (measured on 18k to 150k-element tensors, 1 and 8 records).
SUMS = (("ref_sq", "Mul", "f"), ("ref_abs", "Abs", "f"), ("test_sq", "Mul", "q"), ("sq_err", "Mul", "d"),
        ("abs_err", "Abs", "d"))  # fmt: skip


def _broadcast(values: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    values = np.asarray(values)
    if values.size == 1:
        return values.reshape(())
    shape = [1] * rank
    shape[axis % rank if axis is not None else 1] = values.size
    return values.reshape(shape)


def _dequantize(b: _Builder, q: str, params: QuantParams, rank: int, q_type: int) -> str:
    """``(q - zero_point) * scale`` in float32, as :meth:`QuantParams.dequantize` computes it."""
    per_channel = np.asarray(params.scale).size > 1
    eight_bit = q_type in (TensorProto.UINT8, TensorProto.INT8)
    if eight_bit and b.opset >= (13 if per_channel else 10) and params.zero_point.dtype in (np.uint8, np.int8):
        zp_type = np.uint8 if q_type == TensorProto.UINT8 else np.int8
        if params.zero_point.dtype == zp_type:
            scale = b.const(params.scale.astype(np.float32).reshape(-1 if per_channel else ()), "scale")
            zp = b.const(params.zero_point.reshape(-1 if per_channel else ()), "zero_point")
            axis = {"axis": params.axis % rank if params.axis is not None else 1} if per_channel else {}
            return b.node("DequantizeLinear", [q, scale, zp], "dequantized", **axis)
    zp = b.const(_broadcast(params.zero_point.astype(np.float32), rank, params.axis), "zero_point")
    scale = b.const(_broadcast(params.scale.astype(np.float32), rank, params.axis), "scale")
    return b.node("Mul", [b.node("Sub", [b.cast(q, TensorProto.FLOAT), zp], "centred"), scale], "dequantized")


def _add_reductions(b: _Builder, spec: ReductionSpec) -> None:
    """The nodes computing ``spec``'s statistics; their output names go into ``spec.outputs``.

    ``sums``: the float32 partial sums of every requested sum field (``spec.sum_fields`` order), each
    over blocks of :func:`_block` elements of the flattened record, shape (records, fields * blocks), added in
    float64. ``max_abs``: per-record max |f - q| where |f - q| is summed anyway, else ``max_diff``/``min_diff``,
    the extremes of f - q. Then ``span_*``, ``ref_min``, ``ref_max``, ``steps`` and ``saturated`` as asked.
    """
    dims, fields, rank = spec.dims, spec.fields, len(spec.dims) + 1
    count, block = int(np.prod(dims)), _block(dims)
    everything = list(range(1, rank))
    f, q = b.scoped(FP32_PREFIX, spec.fp32), b.scoped(QUANT_PREFIX, spec.capture)
    out = spec.outputs
    if spec.check_shapes:
        out["qshape"] = b.node("Shape", [q], "shape")
    if spec.params is not None:
        q = _dequantize(b, q, spec.params, rank, spec.q_type)
    blocks_shape = b.ints((0, count // block, block))
    views: dict[str, str] = {}

    def view(source: str) -> str:  # f, q and f - q as blocks of the record (shape (records, blocks, block))
        if source not in views:
            if source == "d":
                views["d"] = b.node("Sub", [view("f"), view("q")], "diff")
            else:
                views[source] = b.node("Reshape", [{"f": f, "q": q}[source], blocks_shape], "blocks")
        return views[source]

    sums = [(name, op, source) for name, op, source in SUMS if name in fields]
    if spec.cross:  # sum f(f - q) in place of sum q^2 (see CROSS)
        sums = [x for x in sums if x[0] != "test_sq"] + [(CROSS, "Mul", "fd")]
    spec.sum_fields = tuple(name for name, _, _ in sums)
    terms: dict[tuple[str, str], str] = {}
    partials = []
    for _, op, source in sums:
        if source == "fd":
            term = b.node("Mul", [view("f"), view("d")], "cross")
        else:
            x = view(source)
            term = b.node(op, [x, x] if op == "Mul" else [x], "square" if op == "Mul" else "abs")
        terms[(op, source)] = term
        partials.append(b.reduce("ReduceSum", term, [2], "sum"))
    if partials:
        out["sums"] = partials[0] if len(partials) == 1 else b.node("Concat", partials, "sums", axis=1)
    if "max_abs_err" in fields and ("Abs", "d") in terms:  # |f - q| is there: one reduction
        out["max_abs"] = b.reduce("ReduceMax", terms[("Abs", "d")], [1, 2], "max_abs")
    elif "max_abs_err" in fields:  # two reductions read f - q; taking |f - q| first would write it
        out["max_diff"] = b.reduce("ReduceMax", view("d"), [1, 2], "max")
        out["min_diff"] = b.reduce("ReduceMin", view("d"), [1, 2], "min")
    if spec.spans:
        for kind in ("ReduceMin", "ReduceMax"):
            _span_nodes(b, kind, f, dims, out)
    elif {"ref_min", "ref_max"} & fields:
        out["ref_min"] = b.reduce("ReduceMin", f, everything, "min")
        out["ref_max"] = b.reduce("ReduceMax", f, everything, "max")
    if spec.steps and spec.params is not None:
        d64 = b.node("Sub", [b.cast(f, TensorProto.DOUBLE), b.cast(q, TensorProto.DOUBLE)], "diff64")
        scale64 = b.const(_broadcast(spec.params.scale.astype(np.float64), rank, spec.params.axis), "scale64")
        steps = b.node("Div", [b.node("Abs", [d64], "abs"), scale64], "steps")
        out["steps"] = b.reduce("ReduceMax", steps, everything, "steps_max")
    if spec.bounds is not None:
        _saturation_nodes(b, spec, f, count, out)


def _count_outside(b: _Builder, f: str, low: str, high: str, rank: int, exact: int) -> str:
    """Per record, the elements of ``f`` below ``low`` or above ``high`` (float32 constants)."""
    outside = b.node("Or", [b.node("Less", [f, low], "below"), b.node("Greater", [f, high], "above")], "outside")
    return b.reduce("ReduceSum", b.cast(outside, exact), list(range(1, rank)), "saturated")


def _saturation_nodes(b: _Builder, spec: ReductionSpec, f: str, count: int, out: dict[str, str]) -> None:
    """``saturated``: per record, the fp32 values with ``f < low`` or ``f >= high`` (``spec.bounds``).

    ``f >= high`` is ``f > the float32 just below high`` rounded up, which is exact for float32 ``f``.
    With one range for the tensor, the count runs only in batches whose extremes (already reduced)
    leave it, as the whole-tensor path scans only such records: an If node, zeros otherwise.
    """
    low, high = spec.bounds
    top = float32_at_least(high)
    low_c, high_c = b.const(float32_at_least(low), "low"), b.const(np.nextafter(top, np.float32(-np.inf)), "high")
    exact = TensorProto.FLOAT if count < 2**24 else TensorProto.INT64  # float32 counts are exact below 2^24
    rank = len(spec.dims) + 1
    lows, highs = out.get("span_min1", out.get("ref_min")), out.get("span_max1", out.get("ref_max"))
    if np.asarray(low).size != 1 or exact != TensorProto.FLOAT or b.opset < 11 or lows is None or highs is None:
        out["saturated"] = _count_outside(b, f, low_c, high_c, rank, exact)
        return
    below = b.node("Less", [b.node("ReduceMin", [lows], "batch_min", keepdims=0), low_c], "batch_below")
    above = b.node("Greater", [b.node("ReduceMax", [highs], "batch_max", keepdims=0), high_c], "batch_above")
    branches = []
    for taken in (True, False):
        sub = _Builder(onnx.GraphProto(name=b.name("branch").replace("/", "_")), b.opset, b.inputs, parent=b)
        if taken:
            result = _count_outside(sub, f, low_c, high_c, rank, exact)
        else:
            records = sub.node("Slice", [sub.node("Shape", [lows], "shape"), sub.ints([0]), sub.ints([1])], "records")
            result = sub.node("ConstantOfShape", [records], "zeros")  # float32 zeros: its default value
        sub.graph.output.append(helper.make_tensor_value_info(result, exact, None))
        branches.append(sub.graph)
    cond = b.node("Or", [below, above], "batch_outside")
    out["saturated"] = b.node("If", [cond], "saturated", then_branch=branches[0], else_branch=branches[1])


def _span_nodes(b: _Builder, kind: str, f: str, dims: Sequence[int], out: dict[str, str]) -> None:
    """Per-record channel extremes of ``f`` (``kind``: ReduceMin or ReduceMax): ``span_{min,max}1`` of
    shape (records, channels of axis 1), reduced over the contiguous rest; for rank 3 and more also
    ``span_{min,max}_rest``, ``f`` reduced over axis 1 (records, dims 2...), small enough that numpy
    takes axes 2 and 3 from it (strided reductions are onnxruntime's slowest)."""
    tag = "min" if kind == "ReduceMin" else "max"
    rank = len(dims) + 1
    if rank == 2:
        out[f"span_{tag}1"] = b.node("Identity", [f], f"span_{tag}")
        return
    out[f"span_{tag}1"] = b.reduce(kind, f, list(range(2, rank)), f"span_{tag}")
    out[f"span_{tag}_rest"] = b.reduce(kind, f, [1], f"span_{tag}_rest")


#: Ops whose subgraphs may read tensors of the graph around them.
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})


def _interleave(graph: onnx.GraphProto, groups: Sequence[range]) -> None:
    """Order the nodes so that each group of reduction nodes comes right after what it reads.

    The session runs in this order (``in_node_order``): both models advance together, layer by layer,
    and each captured tensor is reduced and freed while still in cache. In onnxruntime's default
    depth-first order each model ran to its end before any reduction, every captured tensor alive at
    once: PP-OCRv4's detector at 8 records peaked at 1.0 GB instead of 0.33 GB, and ran 30 % slower.
    """
    nodes = list(graph.node)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    inputs = [node_reads(node) if node.op_type in _SUBGRAPH_OPS else node.input for node in nodes]
    reads = [sorted({producer[x] for x in names if x in producer}) for names in inputs]
    done: set[int] = set()
    order: list[int] = []

    def emit(root: int) -> None:  # post-order, iteratively (graphs are deep)
        stack = [(root, False)]
        while stack:
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            stack.extend((j, False) for j in reversed(reads[i]) if j not in done)

    for group in groups:
        for i in group:
            emit(i)
    for i in range(len(nodes)):
        emit(i)
    graph.ClearField("node")
    graph.node.extend(nodes[i] for i in order)


def build_reduction_model(
    f: onnx.ModelProto,
    q: onnx.ModelProto,
    inputs: Sequence[str],
    specs: Sequence[ReductionSpec],
    keep: Sequence[tuple[str, str]],
) -> onnx.ModelProto:
    """The merged model of ``f`` and ``q`` with ``specs``' reductions and ``keep`` = [(prefix, tensor)]
    as graph outputs (whole tensors the caller still wants)."""
    model = merge_models(f, q, inputs)
    opset = next((o.version for o in model.opset_import if (o.domain or "") == ""), 0)
    if opset < 9:
        raise ReductionUnavailable(f"opset {opset} is older than the reduction nodes need (9)")
    b = _Builder(model.graph, opset, inputs)
    groups = []
    for spec in specs:
        spec.outputs.clear()
        first = len(model.graph.node)
        _add_reductions(b, spec)
        groups.append(range(first, len(model.graph.node)))
    _interleave(model.graph, groups)
    whole = [b.scoped(p, t) for p, t in keep]
    for name in dict.fromkeys([*whole, *(o for s in specs for o in s.outputs.values())]):
        model.graph.output.append(onnx.ValueInfoProto(name=name))
    return model


# -- running ------------------------------------------------------------------------------------


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` equal, else close as :class:`OrtRunner` judges (most of the merged graph's
    thousands of small statistics are equal, which is checked faster than closeness)."""
    return (a.shape == b.shape and np.array_equal(a, b)) or _close(a, b)


class ReducedRunner(BatchUnits):
    """Runs both models of a pair in one onnxruntime session; per batch, the whole tensors asked for
    (by model) and each spec's per-record statistics.

    Args:
        fp32, quantized: the models.
        inputs: the shared input names.
        specs: the pairs to reduce.
        fp32_tensors, q_tensors: tensors of each model fetched whole (outputs, custom metrics).
        options, q_options: the sessions' options of the plain runners (``q_options`` for the capture mode).
        label: for messages.

    Raises:
        ReductionUnavailable: the merged graph cannot be built or loaded (the plain runners can still run).
    """

    def __init__(
        self,
        fp32: onnx.ModelProto,
        quantized: onnx.ModelProto,
        inputs: Sequence[str],
        specs: Sequence[ReductionSpec],
        fp32_tensors: Sequence[str],
        q_tensors: Sequence[str],
        options: RuntimeOptions,
        q_options: RuntimeOptions,
        label: str,
    ) -> None:
        self.label, self.specs = label, list(specs)
        self.options, self.q_options = options, q_options
        self.inputs = list(inputs)
        self.fp32_tensors, self.q_tensors = list(dict.fromkeys(fp32_tensors)), list(dict.fromkeys(q_tensors))
        self._models = (fp32, quantized)
        dims = _batch_dims(fp32)
        self.dynamic = all(not isinstance(d, int) for d in dims)
        relaxed = (
            not self.dynamic and all(d == 1 for d in dims) and not bakes_batch(fp32) and not bakes_batch(quantized)
        )
        self._relaxed = relaxed
        self._session, self._names = self._build(relaxed)
        self.batching = self.dynamic or relaxed
        self._verified = False

    def _optimized(
        self, model: onnx.ModelProto, tensors: list[str], options: RuntimeOptions, relaxed: bool, folder: Path, tag: str
    ) -> onnx.ModelProto:
        """``model`` with ``tensors`` exposed, as onnxruntime's session at ``options`` optimizes it.

        Also with optimizations off (``reference`` capture): the merged graph built from the model as
        onnxruntime saves it peaked at 0.28 GB on PP-OCRv4's detector at 8 records, from the model as
        given at 0.83 GB (same values)."""
        exposed = _with_outputs(model, tensors, relaxed)
        path = folder / f"{tag}.onnx"
        try:
            make_session(
                exposed,
                providers=options.providers,
                threads=options.threads,
                optimization=options.optimization,
                config=options.session_config,
                optimized_model_path=path,
            )
            return onnx.load(path)
        except Exception as exc:
            raise ReductionUnavailable(
                f"onnxruntime cannot save the optimized {tag} model ({first_line(exc)})"
            ) from None

    def _build(self, relaxed: bool):
        fp32, quantized = same_opsets(*self._models)
        f_exposed = [*self.fp32_tensors, *(s.fp32 for s in self.specs)]
        q_exposed = [*self.q_tensors, *(s.capture for s in self.specs)]
        try:
            with tempfile.TemporaryDirectory(prefix="qaccuracy-") as tmp:
                f_opt = self._optimized(fp32, f_exposed, self.options, relaxed, Path(tmp), "fp32")
                q_opt = self._optimized(quantized, q_exposed, self.q_options, relaxed, Path(tmp), "quantized")
            keep = [(FP32_PREFIX, t) for t in self.fp32_tensors] + [(QUANT_PREFIX, t) for t in self.q_tensors]
            model = build_reduction_model(f_opt, q_opt, self.inputs, self.specs, keep)
        except ReductionUnavailable:
            raise
        except Exception as exc:  # an unforeseen graph: the plain path still works
            raise ReductionUnavailable(
                f"the merged graph cannot be built ({type(exc).__name__}: {first_line(exc)})"
            ) from None
        try:
            session = make_session(
                model,
                providers=self.options.providers,
                threads=self.options.threads,
                optimization="disable",
                config={**spin_during_run(), **self.options.session_config},
                in_node_order=True,
                # the memory pattern lays every tensor of a run out in one block, at offsets planned
                # once: with thousands of short-lived tensors of every size the block grew far beyond
                # what is alive at any time (the bench's mobile net, a run of 8 records: 789 MB with
                # it, 494 MB without; PP-OCRv4's detector 288 and 246 MB; the same speed)
                mem_pattern=False,
            )
        except Exception as exc:
            raise ReductionUnavailable(f"onnxruntime cannot load the merged graph ({first_line(exc)})") from None
        return session, [o.name for o in model.graph.output]

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return fetch(self._session, self._names, feeds)
        except ModelError as exc:  # a tensor onnxruntime cannot return (int4), named
            raise ModelError(f"{self.label}: {exc}") from None
        except Exception as exc:
            raise ModelError(f"{self.label}: onnxruntime failed to run the merged graph ({first_line(exc)})") from None

    def run(self, batch: Batch) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
        """(fp32 tensors, quantized tensors, per spec its statistics by name) for ``batch``."""
        parts = self._first_stacked(batch) if len(batch) > 1 and self.batching and not self._verified else None
        if parts is None:
            parts = self._run_units(batch)
        if len(parts) == 1:
            values = dict(zip(self._names, parts[0], strict=True))
        else:
            values = {}
            for i, name in enumerate(self._names):
                if name.endswith("/shape"):
                    values[name] = parts[0][i].copy()
                    values[name][0] = sum(p[i][0] for p in parts)
                else:
                    values[name] = join_records([p[i] for p in parts])
        ref = {t: values[t if t in self.inputs else FP32_PREFIX + t] for t in self.fp32_tensors}
        test = {t: values[t if t in self.inputs else QUANT_PREFIX + t] for t in self.q_tensors}
        return ref, test, [{k: values[v] for k, v in s.outputs.items()} for s in self.specs]

    def _first_stacked(self, batch: Batch) -> list[list[np.ndarray]] | None:
        """The first batch of two or more records run stacked, kept as its result; None when the
        records must run one at a time (then :attr:`batching` is off).

        A dynamic batch is taken if it runs. A batch fixed at 1 and relaxed must also give its last
        record what a run of that record alone gives (as :class:`OrtRunner` checks on two records;
        the last one, because a batch-1 model that takes its record by index 0 gets the first one
        right). The check costs one run of one record: the batch's stacked run is both the check's
        and the batch's result (a run of one record costs nearly what a run of eight does).
        """
        self._verified = True
        try:
            together = self._run(batch.stacked())
        except InputError:  # ModelError is one
            together = None
        if together is not None and not self.dynamic:
            single = self._run(batch.records[-1])
            count = len(batch)
            if not all(
                name.endswith("/shape") or (t.shape[:1] == (count,) and _same(t[-1:], s))
                for name, t, s in zip(self._names, together, single, strict=True)
            ):
                together = None
        if together is not None:
            return [together]
        self.batching = False
        if self._relaxed:
            self._session, self._names = self._build(False)
        return None

    def _verify(self, batch: Batch) -> None:
        """Stacked records must give what single records give (see :meth:`_first_stacked`)."""
        self._first_stacked(batch)
