"""A quantization recipe: the choices a search makes, and the ``quantize_static`` arguments they are.

Global choices are onnxruntime's own arguments (calibration method, per-channel weights, 7-bit
weights, activation and weight types); per node, a node stays 8-bit, gets 16-bit activations
(``TensorQuantOverrides`` on the tensors it reads and writes) or stays in float
(``nodes_to_exclude``), and its weight may take the other granularity than the global
``per_channel`` (a ``TensorQuantOverrides`` entry on the weight: with ``axis``, per channel; without,
per tensor; onnxruntime's QDQ quantizer honours both since 1.18), the other ``reduce_range`` (7-bit or
8-bit: the entry's ``reduce_range``) and the other 8-bit type (the entry's ``quant_type``; not uint8
with int8 activations). One entry per weight carries all three. The last two need an onnxruntime newer
than 1.18 (:func:`refusal`). :meth:`Recipe.arguments` is what a user pastes into their own
``quantize_static`` call, as JSON.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_qaccuracy.analysis.calibration.quantize import LARGE_MODEL_BYTES
from pytest_qaccuracy.plain import Plain

#: Per-node precisions, cheapest first (the cost model weighs each, see :mod:`.cost`).
PRECISIONS = ("int8", "int16", "float")
#: onnxruntime's QuantType names of the activation and weight types.
QUANT_TYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}
#: (activation type, weight type) pairs onnxruntime's quantize_static refuses ("doesn't support data
#: format"): an estimate of one is a listed skip, as its experiment would be.
REFUSED = {("int8", "uint8"): "onnxruntime's quantize_static refuses int8 activations with uint8 weights"}
#: The 16-bit activation type that goes with each 8-bit activation type.
WIDE = {"uint8": "uint16", "int8": "int16"}
#: The other 8-bit weight type (a node's weight retyped).
OTHER_TYPE = {"int8": "uint8", "uint8": "int8"}
#: Why onnxruntime 1.18 cannot take a per-node weight type or 7-bit choice (measured: its QDQ quantizer
#: writes a per-tensor MatMul weight as an activation: uint8 whatever the weight type, the global
#: reduce_range ignored, an int8 override asymmetric), so the model would not be the one estimated.
OLD_ORT_PER_NODE = (
    "onnxruntime {version} quantizes a per-tensor MatMul weight as an activation (uint8 whatever the weight "
    "type, reduce_range ignored): a per-node weight type or 7-bit weight needs an onnxruntime newer than 1.18"
)


@dataclass(frozen=True, slots=True)
class Recipe(Plain):
    """One point of the search space.

    Attributes:
        method: a calibration method: one of ``calibration.METHODS`` (ours, ranges handed to
            onnxruntime as its calibration cache) or ``ort-minmax``, ``ort-entropy``,
            ``ort-percentile`` (onnxruntime's own calibrators with their defaults).
        per_channel, reduce_range: ``quantize_static``'s arguments of those names.
        activation_type, weight_type: ``uint8`` or ``int8``.
        int16: nodes whose activations (inputs and outputs) are 16-bit.
        float: nodes kept in float (``nodes_to_exclude``).
        flipped: nodes whose weight has the other granularity: per channel when ``per_channel`` is
            False, per tensor when it is True (costs nothing: no node changes type).
        narrowed: nodes whose weight has the other ``reduce_range`` (7-bit when it is False, 8-bit when
            it is True; costs nothing).
        retyped: nodes whose weight has the other 8-bit type (int8 <-> uint8; costs nothing).
    """

    method: str = "minmax"
    per_channel: bool = False
    reduce_range: bool = False
    activation_type: str = "uint8"
    weight_type: str = "int8"
    int16: frozenset[str] = field(default_factory=frozenset)
    float: frozenset[str] = field(default_factory=frozenset)
    flipped: frozenset[str] = field(default_factory=frozenset)
    narrowed: frozenset[str] = field(default_factory=frozenset)
    retyped: frozenset[str] = field(default_factory=frozenset)

    def precision(self, node: str) -> str:
        return "float" if node in self.float else "int16" if node in self.int16 else "int8"

    def with_precision(self, node: str, precision: str) -> Recipe:
        """This recipe with ``node`` at ``precision`` (one of :data:`PRECISIONS`)."""
        int16, floats = set(self.int16) - {node}, set(self.float) - {node}
        {"int16": int16, "float": floats}.get(precision, set()).add(node)
        return replace(self, int16=frozenset(int16), float=frozenset(floats))

    def with_flip(self, node: str) -> Recipe:
        """This recipe with ``node``'s weight granularity flipped (again: back)."""
        return replace(self, flipped=self.flipped ^ {node})

    def with_move(self, kind: str, node: str) -> Recipe:
        """This recipe with one per-node weight move toggled: ``kind`` is one of :data:`WEIGHT_MOVES`."""
        return replace(self, **{kind: getattr(self, kind) ^ {node}})

    def weight_type_of(self, node: str) -> str:
        """The 8-bit type of ``node``'s weight."""
        return OTHER_TYPE[self.weight_type] if node in self.retyped else self.weight_type

    def with_nodes(self, precisions: Mapping[str, str]) -> Recipe:
        """This recipe's global choices and weight flips with exactly these non-int8 nodes (a float
        node's flip dropped: its weight stays float, so the recipe is the one without it)."""
        floats = frozenset(n for n, p in precisions.items() if p == "float")
        return replace(
            self,
            int16=frozenset(n for n, p in precisions.items() if p == "int16"),
            float=floats,
            flipped=self.flipped - floats,
            narrowed=self.narrowed - floats,
            retyped=self.retyped - floats,
        )

    @property
    def global_key(self) -> tuple[str, bool, bool, str, str]:
        return (self.method, self.per_channel, self.reduce_range, self.activation_type, self.weight_type)

    def changes_from(self, other: Recipe) -> str:
        """What differs from ``other``, in one short phrase (``per_channel=True, float +conv3``)."""
        parts = [
            f"{name}={mine}"
            for name, mine, theirs in zip(
                ("method", "per_channel", "reduce_range", "activation_type", "weight_type"),
                self.global_key,
                other.global_key,
                strict=True,
            )
            if mine != theirs
        ]
        for precision, mine, theirs in (("int16", self.int16, other.int16), ("float", self.float, other.float)):
            added, removed = sorted(mine - theirs), sorted(theirs - mine)
            if added:
                parts.append(f"{precision} +{_names(added)}")
            if removed:
                parts.append(f"{precision} -{_names(removed)}")
        for kind, mine, theirs in (
            ("per-tensor" if self.per_channel else "per-channel", self.flipped, other.flipped),
            ("8-bit" if self.reduce_range else "7-bit", self.narrowed, other.narrowed),
            (OTHER_TYPE[self.weight_type], self.retyped, other.retyped),
        ):
            added, removed = sorted(mine - theirs), sorted(theirs - mine)
            if added:
                parts.append(f"{kind} weight +{_names(added)}")
            if removed:
                parts.append(f"{kind} weight -{_names(removed)}")
        return ", ".join(parts) or "(same)"

    def overrides(
        self, reads: Mapping[str, Sequence[str]], weights: Mapping[str, tuple[str, int]] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """``TensorQuantOverrides``: the 16-bit nodes' activation tensors (``reads``: node -> its float
        activation tensors, inputs and outputs) at the wide type, by QuantType name; the weights of the
        nodes with a per-node weight choice (``weights``: node -> its weight initializer and channel
        axis) by one entry: ``axis`` when per channel (an entry without it is per tensor), ``quant_type``
        when per tensor or retyped, ``reduce_range`` when narrowed."""
        wide = QUANT_TYPES[WIDE[self.activation_type]]
        tensors = sorted({t for node in self.int16 for t in reads.get(node, ())})
        table: dict[str, list[dict[str, Any]]] = {t: [{"quant_type": wide}] for t in tensors}
        for node in sorted((self.flipped | self.narrowed | self.retyped) - self.float):
            if node not in (weights or {}):
                continue
            name, axis = weights[node]
            entry: dict[str, Any] = {}
            if self.per_channel != (node in self.flipped):
                entry["axis"] = axis
            if "axis" not in entry or node in self.retyped:
                entry["quant_type"] = QUANT_TYPES[self.weight_type_of(node)]
            if node in self.narrowed:
                entry["reduce_range"] = not self.reduce_range
            table[name] = [entry]
        return table

    def arguments(
        self,
        reads: Mapping[str, Sequence[str]],
        cache: str | None,
        weights: Mapping[str, tuple[str, int]] | None = None,
    ) -> dict[str, Any]:
        """The ``quantize_static`` keyword arguments, JSON-able (QuantType and method by name).

        ``cache``: the calibration cache file (our ranges) for our methods; onnxruntime's own
        calibrators are named by ``calibrate_method`` and need a data reader instead.
        """
        args: dict[str, Any] = {
            "quant_format": "QDQ",
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "activation_type": QUANT_TYPES[self.activation_type],
            "weight_type": QUANT_TYPES[self.weight_type],
            "nodes_to_exclude": sorted(self.float),
            "extra_options": {"TensorQuantOverrides": self.overrides(reads, weights)},
        }
        if self.method.startswith("ort-"):
            args["calibrate_method"] = ORT_METHODS[self.method]
        else:
            args["calibrate_method"] = "MinMax"
            args["calibration_cache_path"] = cache
        return args


#: The per-node weight moves a search makes at cost 0 (each a :class:`Recipe` field of node names).
WEIGHT_MOVES = ("flipped", "narrowed", "retyped")


def refusal(recipe: Recipe, version: str | None = None) -> str | None:
    """Why onnxruntime (``version``, default the installed one) cannot write ``recipe``, or None: an
    activation and weight type pair it refuses, globally or for a retyped node's weight, or per-node
    weight types and 7-bit weights on onnxruntime 1.18."""
    reason = REFUSED.get((recipe.activation_type, recipe.weight_type))
    if reason is None and recipe.retyped - recipe.float:
        reason = REFUSED.get((recipe.activation_type, OTHER_TYPE[recipe.weight_type]))
    if reason is None and (recipe.narrowed | recipe.retyped) - recipe.float:
        if version is None:
            import onnxruntime

            version = onnxruntime.__version__
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) <= (1, 18):
            reason = OLD_ORT_PER_NODE.format(version=version)
    return reason


#: onnxruntime's calibrators, by the name a recipe gives them, and their CalibrationMethod.
ORT_METHODS = {"ort-minmax": "MinMax", "ort-entropy": "Entropy", "ort-percentile": "Percentile"}


def _names(names: Sequence[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ",".join(names[:shown]) + (f" (+{more} more)" if more > 0 else "")


def python_snippet(
    arguments: Mapping[str, Any],
    fp32: str,
    out: str,
    calibration_data: str,
    convert_opset: int | None = None,
    records: int | None = None,
) -> str:
    """A Python script that writes the recipe's model with onnxruntime alone (plus our data reader
    when onnxruntime's own calibrators need the records: the first ``records`` of them, or all).

    The model and data paths are written as given (absolute ones run from any working folder); the
    recipe's own files (``out``, the calibration cache) when relative are beside the script.
    ``convert_opset``: the script first converts the fp32 model to that opset with onnx's version
    converter, into a temporary folder, as the search did before ``quantize_static``.
    """
    head = ["from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static"]
    body = ["", "HERE = Path(__file__).resolve().parent", f"fp32 = {fp32!r}", f"out = {_beside(out)}"]
    if "calibration_cache_path" in arguments:
        reader = "None,  # the ranges come from the calibration cache"
    else:
        head.append("from pytest_qaccuracy.analysis.calibration.reader import DatasetReader")
        body.append(f"reader = DatasetReader({calibration_data!r}, fp32)")
        if records is not None:
            body.append(f"reader.set_range(0, {records})  # the records the search calibrated on")
        reader = "reader,"
    overrides = arguments.get("extra_options", {}).get("TensorQuantOverrides", {})
    body.append("overrides = {")
    body += [f"    {name!r}: [{_entry(entries[0])}]," for name, entries in overrides.items()]
    body.append("}")
    call = ["quantize_static(", "    model_input,", "    out,", f"    {reader}"]
    enums = {"quant_format": "QuantFormat", "activation_type": "QuantType", "weight_type": "QuantType"}
    enums["calibrate_method"] = "CalibrationMethod"
    for key, value in arguments.items():
        if key == "extra_options":
            rest = {k: v for k, v in value.items() if k != "TensorQuantOverrides"}
            text = "{" + "".join(f"{k!r}: {v!r}, " for k, v in rest.items()) + "'TensorQuantOverrides': overrides}"
        elif key in enums:
            text = f"{enums[key]}.{value}"
        elif key == "calibration_cache_path" and value is not None:
            text = _beside(value)
        else:
            text = repr(value)
        call.append(f"    {key}={text},")
    call.append(")")
    if convert_opset is None:
        return "\n".join(["from pathlib import Path", "", *head, *body, "model_input = fp32", *call]) + "\n"
    imports = ["import tempfile", "from pathlib import Path", "", "import onnx", "from onnx import version_converter"]
    converted = [
        f"# per-channel weights need DequantizeLinear's axis (opset {convert_opset}): convert the model first",
        "with tempfile.TemporaryDirectory() as tmp:",
        f"    model = version_converter.convert_version(onnx.load(fp32), {convert_opset})",
        f"    model_input = str(Path(tmp) / ('opset{convert_opset}.' + Path(fp32).name))",
        f"    onnx.save(model, model_input, save_as_external_data=model.ByteSize() > {LARGE_MODEL_BYTES})",
        *(f"    {line}" for line in call),
    ]
    return "\n".join([*imports, *head, *body, *converted]) + "\n"


def _entry(entry: Mapping[str, Any]) -> str:
    """One override entry as Python: QuantType by its enum, the rest as written."""
    parts = [f"{k!r}: QuantType.{v}" if k == "quant_type" else f"{k!r}: {v!r}" for k, v in entry.items()]
    return "{" + ", ".join(parts) + "}"


def _beside(name: str) -> str:
    """A file of the recipe, in its script: beside the script, unless the path is absolute."""
    return repr(name) if os.path.isabs(name) else f"str(HERE / {name!r})"
