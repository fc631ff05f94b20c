"""``IntegerSession``: run a quantized ONNX model on emulated integer kernels.

The loop is generic: each step's kernel comes from the registry (or a fallback: onnxruntime running the
node alone, else ``onnx.reference``),
inputs are gathered by name, outputs stored by name, and every produced tensor can stream to a
callback. QDQ groups are fused first (``fusion.py``), as onnxruntime does.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper

from pytest_qaccuracy.backend import heap, int8_to_uint8, pairs, parallel, tables, weight_groups
from pytest_qaccuracy.backend import kernels as _kernels  # noqa: F401  (registers every kernel family)
from pytest_qaccuracy.backend.fallback import KERNEL, ONNXRUNTIME, REFERENCE, OnnxruntimeNode, reference_kernel
from pytest_qaccuracy.backend.fusion import fuse_qdq
from pytest_qaccuracy.backend.graph import INTERNAL_PREFIX, Step, steps_from_graph, tensor_types
from pytest_qaccuracy.backend.registry import INTERNAL_DOMAIN, NotHandled, find_kernel, normalize_domain, unsupported
from pytest_qaccuracy.backend.scheme import Scheme, get_scheme
from pytest_qaccuracy.backend.tables import TABLE
from pytest_qaccuracy.backend.weight_quantization import quantize_float_weights
from pytest_qaccuracy.errors import InputError, QAccuracyError, UnsupportedOpError
from pytest_qaccuracy.model.loading import load_model

TensorCallback = Callable[[str, np.ndarray], None]
#: Float pools that keep our kernels under the host preset: their taps sum in onnxruntime's row-major
#: order (``tests/backend/test_pool_grid.py``), which equals the NCHWc pooling of a whole session,
#: while a one-node session runs the plain kernel (PP-OCRv4's recognizer, s8s8 default session: 115
#: output values apart through one AveragePool)
POOLS_IN_ORT_ORDER = frozenset({"AveragePool", "GlobalAveragePool"})
_STANDARD_HINT = "; the standard ai.onnx QuantizeLinear/DequantizeLinear at opset 21 or later take 4-bit types"
#: ONNX element types without a numpy type of their own (4-bit, 2-bit and 8-bit floats), by their names
NARROW_TYPES = frozenset({"int4", "uint4", "int2", "uint2", "float4e2m1", "float8e4m3fn", "float8e4m3fnuz",
                          "float8e5m2", "float8e5m2fnuz", "float8e8m0"})  # fmt: skip


@dataclass(frozen=True, slots=True)
class TensorArg:
    """A graph input or output, shaped like onnxruntime's ``NodeArg``."""

    name: str
    shape: list[int | str | None]
    type: str


class KernelError(QAccuracyError):
    """A kernel failed; the message names the node and op instead of a numpy traceback."""


class PlanStep(NamedTuple):
    """One step of :meth:`IntegerSession.plan`."""

    op: str  #: ``domain::op_type``
    node: str
    fused_from: tuple[str, ...]  #: the original nodes a fused QDQ group replaces
    #: ``kernel`` (ours), ``onnxruntime`` (the node alone), ``onnx.reference``, or ``table`` (elementwise
    #: steps on one 8-bit tensor, run once on its 256 values by their own runners, then looked up)
    runner: str


@dataclass(slots=True)
class _Bound:
    step: Step
    run: Callable[[list[Any]], tuple[Any, ...]]
    runner: str = KERNEL


class IntegerSession:
    """Run a quantized model with the integer arithmetic of a scheme (mirrors ``InferenceSession``).

    Args:
        model: path to an ONNX model, or a ``ModelProto``.
        scheme: a preset name (see ``PRESETS``) or a :class:`Scheme`.
        threads: intra-op threads, as onnxruntime's ``intra_op_num_threads``: 0 uses every available
            core, 1 runs on the calling thread only. Results do not depend on it (every chunk is exact).

    Raises:
        ModelError: the model cannot be loaded.
        UnsupportedOpError: an op has neither a kernel nor an ``onnx.reference`` implementation.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | onnx.ModelProto,
        scheme: str | Scheme | None = "onnxruntime",
        threads: int = 0,
    ):
        try:
            self.threads = operator.index(threads)  # ints and numpy integers, not floats or strings
        except TypeError:
            self.threads = -1
        if self.threads < 0 or isinstance(threads, bool):
            raise InputError(f"threads must be an integer >= 0, got {threads!r}")
        self.model = model if isinstance(model, onnx.ModelProto) else load_model(model)
        self.scheme = get_scheme(scheme)
        heap.keep_temporaries_warm()
        graph = self.model.graph
        self.opsets = {normalize_domain(o.domain): o.version for o in self.model.opset_import}
        self.constants = {i.name: _read_only(onnx.numpy_helper.to_array(i)) for i in graph.initializer}
        self.types = tensor_types(self.model)
        self._steps = steps_from_graph(graph)
        self._graph_outputs = [o.name for o in graph.output]
        self._inputs = [v for v in graph.input if v.name not in self.constants]
        self._all_tensors = {o for s in self._steps for o in s.outputs if o} | set(self.constants)
        self._all_tensors |= {v.name for v in self._inputs}
        self._plans: dict[frozenset[str], list[_Bound]] = {}
        self._rewritten: dict[bool, dict[str, str]] = {}  # weight groups onnxruntime rewrites, per session kind
        self._converted: dict[frozenset[str], frozenset[str]] = {}  # tensors run as uint8, per plan
        fused = self._plan(frozenset())  # bind every kernel now, so unsupported ops fail at construction
        # tensors that fusion removed (float interiors of QDQ groups): asking for one changes the plan
        produced = {o for b in fused for o in b.step.outputs} | set(self.constants) | {v.name for v in self._inputs}
        self._fusion_sensitive = self._all_tensors - produced
        # asking for a weight group's output that another step reads leaves it as written, as onnxruntime does
        read = {i for b in fused for i in b.step.inputs if i}
        self._fusion_sensitive |= {b.step.outputs[0] for b in fused if b.step.group and b.step.outputs[0] in read}
        self._int8_activations = {o for b in fused for o in b.step.outputs if self.types.get(o) == np.int8}

    # -- onnxruntime-like API -----------------------------------------------------------------

    def get_inputs(self) -> list[TensorArg]:
        return [_arg(v) for v in self._inputs]

    def get_outputs(self) -> list[TensorArg]:
        return [_arg(v) for v in self.model.graph.output]

    def plan(self) -> list[PlanStep]:
        """The steps a full run executes, with the QDQ groups that became integer kernels and the runner
        of each step: ops without a kernel of ours run in onnxruntime, node by node, and only where
        onnxruntime cannot (or under the ``onnx-reference`` preset) in ``onnx.reference``.
        """
        return [
            PlanStep(f"{b.step.domain or 'ai.onnx'}::{b.step.op_type}", b.step.name, b.step.fused, b.runner)
            for b in self._plan(frozenset())
        ]

    def run(
        self,
        output_names: Iterable[str] | None,
        feeds: Mapping[str, np.ndarray],
        *,
        on_tensor: TensorCallback | None = None,
    ) -> list[np.ndarray]:
        """Run the model; return the named tensors (graph outputs when ``None``).

        Args:
            output_names: any tensors of the graph, intermediate ones included. A float tensor inside a
                fused QDQ group is computed by leaving that group unfused, as onnxruntime would if it
                were a graph output.
            feeds: input name -> array; a batch of records may ride on the batch axis.
            on_tensor: called as ``on_tensor(name, value)`` for every tensor the run produces, in
                topological order; the whole graph runs (nothing is pruned).

        Raises:
            InputError: an unknown output name, or a missing or mistyped input.
            KernelError: a kernel failed; the message names the node and the op.
        """
        names = list(self._graph_outputs if output_names is None else output_names)
        unknown = [n for n in names if n not in self._all_tensors]
        if unknown:
            raise InputError(f"unknown tensor name(s) {unknown[:5]}: not produced by the model")
        values: dict[str, Any] = dict(self.constants)
        values.update(self._check_feeds(feeds))
        # asking for a fusion interior, or for an int8 activation that may run as uint8, changes the plan
        requested = frozenset(names) & (self._fusion_sensitive | self._int8_activations)
        plan = self._plan(requested)
        if on_tensor is None:
            plan = _prune(plan, names)
        elif self._converted[requested]:
            on_tensor = _reporting_model_types(on_tensor, self._converted[requested])
        last_use = _last_use(plan, set(names))
        with parallel.using(self.threads):
            self._execute(plan, values, last_use, on_tensor)
        return [values[n] for n in names]

    def _execute(
        self,
        plan: list[_Bound],
        values: dict[str, Any],
        last_use: dict[int, list[str]],
        on_tensor: TensorCallback | None,
    ) -> None:
        for index, bound in enumerate(plan):
            step = bound.step
            if pairs.counter is not None:  # saturated pair sums are counted per node
                pairs.counter.node = step.fused[0] if step.fused else step.name
            missing = [i for i in step.inputs if i and i not in values]
            if missing:
                raise KernelError(f"{step.describe()}: input(s) {missing} were never produced")
            args = [values[i] if i else None for i in step.inputs]
            try:
                outs = bound.run(args)
            except QAccuracyError:
                raise
            except Exception as exc:
                raise KernelError(f"{step.describe()} failed: {type(exc).__name__}: {exc}") from None
            for name, value in zip(step.outputs, outs, strict=False):
                if not name:
                    continue
                values[name] = value
                if on_tensor is not None and not name.startswith(INTERNAL_PREFIX):
                    on_tensor(name, value)
            for name in last_use.get(index, ()):
                values.pop(name, None)

    # -- planning -----------------------------------------------------------------------------

    def _plan(self, requested: frozenset[str]) -> list[_Bound]:
        if requested not in self._plans:
            steps = [_copy(s) for s in self._steps]
            converted: set[str] = set()
            if self.scheme.quantize_float_weights:
                steps = quantize_float_weights(steps, self.constants, self.scheme)
            if self.scheme.fuse_qdq:
                outputs = set(self._graph_outputs)
                types = self.types
                if self.scheme.qdq_int8_to_uint8:
                    steps, zero_points, types, converted = int8_to_uint8.convert(
                        steps, self.constants, self.types, outputs | requested, self.scheme.qdq_pairs_removed_first
                    )
                    self.constants.update(zero_points)  # under internal names
                int8_allowed = not self.scheme.qdq_int8_to_uint8
                opset = self.opsets.get("", 1)
                steps = fuse_qdq(steps, self.constants, types, outputs, set(requested), opset, int8_allowed)
                if self.scheme.float_kernels == "mlas":  # onnxruntime's presets
                    steps = self._weight_groups(steps, types, outputs | requested)
            self._plans[requested] = self._with_tables(steps, [self._bind(s) for s in steps], set(requested))
            self._converted[requested] = frozenset(converted)
        return self._plans[requested]

    def _weight_groups(self, steps: list[Step], types: Mapping[str, Any], keep: set[str]) -> list[Step]:
        """``steps`` with float MatMul/Gemm on constant dequantized weights run as onnxruntime runs them
        (``weight_groups.py``): those that this onnxruntime rewrites in the whole model (``MatMulNBits``)
        in one onnxruntime session each under this machine's preset, refused under another onnxruntime
        preset (CPU-specific arithmetic); the others as written."""
        grouped = weight_groups.group_weights(steps, self.constants, keep)
        candidates = [s for s in grouped if s.group]
        rewritten = self._rewritten_outputs() if candidates else {}
        result = []
        for step in grouped:
            op = rewritten.get(step.outputs[0]) if step.group else None
            if op is None:
                result.extend(step.group or (step,))
            elif self._host_floats:
                result.append(step)
            else:
                from pytest_qaccuracy.backend.host import host_preset

                activation = _source_type(steps, step.inputs[0], types)
                message = weight_groups.refusal(step, [op], types | activation, self.scheme.name, host_preset())
                raise UnsupportedOpError(message)
        return result

    def _rewritten_outputs(self) -> dict[str, str]:
        """Output name -> ``domain::op`` of the weight-rewriting nodes in this onnxruntime's optimized
        graph of the whole model, in the session the scheme emulates (int8 QDQ fusion as the scheme says)."""
        key = self.scheme.qdq_int8_to_uint8
        if key not in self._rewritten:
            config = {} if key else {"session.qdqisint8allowed": "1"}
            self._rewritten[key] = weight_groups.rewritten_outputs(self.model, config)
        return self._rewritten[key]

    @functools.cached_property
    def _initializers(self) -> dict[str, onnx.TensorProto]:
        return {i.name: i for i in self.model.graph.initializer}

    def _with_tables(self, steps: list[Step], bound: list[_Bound], requested: set[str]) -> list[_Bound]:
        """``bound`` with each elementwise group on one 8-bit tensor replaced by a table (``tables.py``)."""
        keep = requested | set(self._graph_outputs)
        chains = tables.find_chains(steps, self.constants, keep)
        if not chains:
            return bound
        first = {chain[0]: chain for chain in chains}
        inside = {i for chain in chains for i in chain}
        kept: list[_Bound] = []
        for index, b in enumerate(bound):
            if index in first:
                chain = first[index]
                table = tables.ChainTable([steps[i] for i in chain], [bound[i].run for i in chain])
                source = tables.varying_input(steps[chain[0]], self.constants)
                kept.append(self._table_step(steps, chain, table, source))
            elif index not in inside:
                kept.append(b)
        return kept

    def _table_step(self, steps: list[Step], chain: list[int], table: tables.ChainTable, source: str) -> _Bound:
        head, tail = steps[chain[0]], steps[chain[-1]]
        fused = tuple(n for i in chain for n in (steps[i].fused or (steps[i].name,)))
        step = Step(head.name, INTERNAL_DOMAIN, "Table", [source], [tail.outputs[0]], fused=fused)
        return _Bound(step, lambda args, t=table: (t.apply(args[0], self.constants),), TABLE)

    def _bind(self, step: Step) -> _Bound:
        if step.group:
            runner = weight_groups.OnnxruntimeGroup(
                step, self.types, self._initializers, self.opsets, self.model.ir_version, self.threads
            )
            return _Bound(step, runner, ONNXRUNTIME)
        opset = self.opsets.get(normalize_domain(step.domain), 1)
        found = find_kernel(step.domain, step.op_type, opset)
        host_float = self._host_floats and step.op_type not in POOLS_IN_ORT_ORDER
        if found is None or (found.float_op and (self.scheme.float_kernels == "reference" or host_float)):
            return self._fallback(step)
        params = inspect.signature(found.fn).parameters
        has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        bad = [a for a in step.attrs if a not in params and not has_kwargs]
        if bad:
            raise unsupported(step.name, step.domain, step.op_type, opset, f"attribute(s) {bad} not supported")
        kwargs = dict(step.attrs)
        if found.needs_scheme:
            kwargs["scheme"] = self.scheme
        if found.needs_outputs:
            kwargs["n_outputs"] = len(step.outputs)
        fn = found.fn
        fallback: list[_Bound] = []

        def run(args: list[Any]) -> tuple[Any, ...]:
            try:
                return fn(*args, **kwargs)
            except NotHandled:  # a case the kernel leaves to the fallback (e.g. a rare mode)
                if not fallback:
                    fallback.append(self._fallback(step))
                return fallback[0].run(args)

        return _Bound(step, run)

    @functools.cached_property
    def _host_floats(self) -> bool:
        """Whether float ops run on this machine's onnxruntime: the scheme is this machine's preset
        (``mlas`` float kernels), so onnxruntime's own float kernels are the ones it emulates. numpy's
        float sums round in another order, and one float ulp before a QuantizeLinear can move a value a
        whole step (issue 32: YOLOv8n s8s8 in the default session, 5,482 of 92,400 output values). The
        other family's preset keeps the numpy kernels: this host's float kernels are not that CPU's."""
        if self.scheme.float_kernels != "mlas":
            return False
        from pytest_qaccuracy.backend.host import host_preset

        return self.scheme.name == host_preset()

    def _fallback(self, step: Step) -> _Bound:
        """``step`` on onnxruntime alone, or on ``onnx.reference`` (its preset, or the last resort)."""
        if self.scheme.float_kernels != "reference":
            types = [self.constants[i].dtype if i in self.constants else self.types.get(i) for i in step.inputs]
            try:
                node = OnnxruntimeNode(step, types, self.opsets, self.model.ir_version, self.threads, self.constants)
            except Exception:  # onnxruntime has no kernel for it, or cannot take it alone
                pass
            else:
                return _Bound(step, node, ONNXRUNTIME)
        try:
            return _Bound(step, reference_kernel(step, self.opsets), REFERENCE)
        except UnsupportedOpError:
            narrow = [(name, self._element_types[name]) for name in step.inputs if name in self._element_types]
            narrow = [(name, kind) for name, kind in narrow if kind in NARROW_TYPES]
            if not narrow:
                raise
            name, kind = narrow[0]
            raise UnsupportedOpError(
                f"{step.describe()}: tensor '{name}' is {kind}, which the integer backend does not support "
                f"in this op and domain (neither onnxruntime alone nor onnx.reference runs the node)"
                f"{_STANDARD_HINT if step.op_type in ('QuantizeLinear', 'DequantizeLinear') else ''}"
            ) from None

    @functools.cached_property
    def _element_types(self) -> dict[str, str]:
        """Tensor name -> ONNX element type name (``int4``, ``float8e4m3fn``, ...) as the model declares it."""
        graph = self.model.graph
        found = {i.name: i.data_type for i in graph.initializer}
        for value in (*graph.input, *graph.value_info, *graph.output):
            if value.type.HasField("tensor_type"):
                found.setdefault(value.name, value.type.tensor_type.elem_type)
        return {name: onnx.TensorProto.DataType.Name(t).lower() for name, t in found.items() if t}

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        checked = {}
        for value in self._inputs:
            if value.name not in feeds:
                raise InputError(f"missing input '{value.name}'")
            array = np.asarray(feeds[value.name])
            want = self.types.get(value.name)
            if want is not None and array.dtype != want:
                raise InputError(f"input '{value.name}': expected {want}, got {array.dtype}")
            _check_shape(value, array.shape)
            checked[value.name] = array
        extra = set(feeds) - {v.name for v in self._inputs}
        if extra:
            raise InputError(f"unknown input(s) {sorted(extra)}; the model takes {[v.name for v in self._inputs]}")
        return checked


def _source_type(steps: list[Step], name: str, types: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: type}`` of the integer tensor that a DequantizeLinear dequantizes into ``name``, if one does."""
    for s in steps:
        if name in s.outputs and s.op_type == "DequantizeLinear" and s.inputs[0] in types:
            return {name: types[s.inputs[0]]}
    return {}


def _reporting_model_types(on_tensor: TensorCallback, converted: frozenset[str]) -> TensorCallback:
    """``on_tensor`` that sees tensors run as uint8 (``int8_to_uint8``) with the model's int8 values."""

    def report(name: str, value: np.ndarray) -> None:
        on_tensor(name, int8_to_uint8.as_model_type(value) if name in converted else value)

    return report


def _copy(step: Step) -> Step:
    return Step(
        step.name, step.domain, step.op_type, list(step.inputs), list(step.outputs), dict(step.attrs), step.proto
    )


def _prune(plan: list[_Bound], names: list[str]) -> list[_Bound]:
    """Only the steps the requested tensors depend on."""
    needed = set(names)
    kept = []
    for bound in reversed(plan):
        if needed.intersection(bound.step.outputs):
            kept.append(bound)
            needed.update(i for i in bound.step.inputs if i)
    return kept[::-1]


def _last_use(plan: list[_Bound], keep: set[str]) -> dict[int, list[str]]:
    """Step index -> tensors that can be freed after it (all but ``keep``, after their last reader)."""
    last: dict[str, int] = {}
    for index, bound in enumerate(plan):
        for name in bound.step.inputs:
            if name:
                last[name] = index
    freed: dict[int, list[str]] = {}
    for name, index in last.items():
        if name not in keep:
            freed.setdefault(index, []).append(name)
    return freed


def _check_shape(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
    """Refuse a feed whose rank or fixed dimensions differ from the declared ones, as onnxruntime does
    (before any kernel runs, instead of failing inside a Reshape that bakes the batch in)."""
    if not value.type.tensor_type.HasField("shape"):
        return
    dims = value.type.tensor_type.shape.dim
    if len(dims) != len(shape):
        raise InputError(f"input '{value.name}': invalid rank, got {len(shape)} {list(shape)}, expected {len(dims)}")
    wrong = [(i, got, d.dim_value) for i, (got, d) in enumerate(zip(shape, dims, strict=True))
             if d.HasField("dim_value") and d.dim_value > 0 and got != d.dim_value]  # fmt: skip
    if wrong:
        where = ", ".join(f"index {i}: got {got}, expected {want}" for i, got, want in wrong)
        raise InputError(f"input '{value.name}': invalid dimensions ({where}) for shape {_arg(value).shape}")


def _arg(value: onnx.ValueInfoProto) -> TensorArg:
    tensor_type = value.type.tensor_type
    dims: list[int | str | None] = []
    for d in tensor_type.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    elem = helper.tensor_dtype_to_string(tensor_type.elem_type).removeprefix("TensorProto.").lower()
    return TensorArg(value.name, dims, f"tensor({_ORT_TYPE_NAMES.get(elem, elem)})")


_ORT_TYPE_NAMES = {"float": "float", "double": "double"}


def _read_only(value: np.ndarray) -> np.ndarray:
    """A session's constant, made read-only: kernels never write into one, and caches keyed on a
    constant (such as the pair bounds of a MatMul's weights) may rely on its values staying put."""
    value.flags.writeable = False
    return value
