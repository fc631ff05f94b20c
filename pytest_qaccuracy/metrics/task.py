"""Task metrics: the accuracy a user decides on (character error rate, box recall, F1), as tolerances.

A task metric folds batches of model outputs, fp32 and quantized side by side, together with the
records' targets when the data has them, into state that merges exactly, and computes its values for
each side. Without targets the quantized side is scored against the fp32 model's own predictions
(agreement), as top-k is.

The protocol (what the plugin calls; :func:`check_task_class` checks it at start-up):

- ``higher_is_better``: ``{value name: bool}``, every value the metric computes (``{"cer": False}``);
- ``update(fp32, quantized, targets)``: one batch; ``fp32`` and ``quantized`` map the fp32 model's
  output names to arrays with the record axis first, ``targets`` is one target per record of the
  batch (any object: a string, an array of boxes, a class) or None;
- ``merge(other)``: fold the state of another instance of the same metric (another batch range, an
  xdist worker); the state should be builtins and arrays, so that it pickles;
- ``compute()``: ``{"fp32": {value name: float or None}, "quantized": {...}}``;
- optionally ``begin(context)``: called once before the first batch with a :class:`TaskContext`.

:class:`TaskMetric` implements the protocol over three smaller methods (``decode``, ``score``,
``finish``) and integer/float sums, which is how the built-ins are written. Metrics are named by
import path (``"mypkg.metrics:CER"``), by an entry point of the group ``pytest_qaccuracy.task_metrics``,
or by a built-in short name (:data:`BUILTIN`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

#: The sides every task metric computes (each deployment target is a quantized side of its own run).
SIDES = ("fp32", "quantized")
#: The methods a task metric must have.
REQUIRED = ("update", "merge", "compute")
#: Entry point group third-party packages register task metrics under.
ENTRY_POINTS = "pytest_qaccuracy.task_metrics"
#: Short names of the built-in task metrics.
BUILTIN: dict[str, str] = {
    "ctc": "pytest_qaccuracy.metrics.ctc:CTCGreedy",
    "yolo_detection": "pytest_qaccuracy.metrics.detection:YoloDetection",
    "binary_f1": "pytest_qaccuracy.metrics.binary:BinaryF1",
}
_VALUE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
#: The option that renames a metric's values (``{metric = "ctc", output = "line", suffix = "line"}`` gives
#: ``cer_line``): one metric on several outputs, each gated on its own.
SUFFIX = "suffix"


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a task metric may need besides the outputs: the fp32 output names, the fp32 model's
    ``metadata_props`` (a CTC recognizer's character list) and how many records the data has."""

    outputs: tuple[str, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)
    records: int = 0


class TaskMetric:
    """Base of sum-state task metrics: decode each side, score it against the targets, keep sums.

    Subclasses set ``higher_is_better`` and implement :meth:`decode` (outputs to one prediction per
    record), :meth:`score` (a batch's sums) and :meth:`finish` (values from the sums). Integer sums
    stay Python ints, so merging shards is exact.
    """

    higher_is_better: ClassVar[Mapping[str, bool]] = {}

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"records": 0, "against": None, **{side: {} for side in SIDES}}
        self.context = TaskContext(())

    def begin(self, context: TaskContext) -> None:
        """Keep the context (output names, model metadata) for :meth:`decode`."""
        self.context = context

    def decode(self, outputs: Mapping[str, Any]) -> Sequence[Any]:
        """One prediction per record of the batch, from the outputs by fp32 output name."""
        raise NotImplementedError

    def as_targets(self, predictions: Sequence[Any]) -> Sequence[Any]:
        """The fp32 predictions in the form of targets (used when the data has none)."""
        return predictions

    def score(self, predictions: Sequence[Any], targets: Sequence[Any]) -> Mapping[str, int | float]:
        """The batch's share of each sum."""
        raise NotImplementedError

    def finish(self, sums: Mapping[str, int | float]) -> dict[str, float | None]:
        """The values from the sums; None where a value is undefined (nothing to count)."""
        raise NotImplementedError

    def update(self, fp32: Mapping[str, Any], quantized: Mapping[str, Any], targets: Sequence[Any] | None) -> None:
        """Fold one batch: both sides decoded, scored against ``targets`` or the fp32 predictions."""
        ref = self.decode(fp32)
        test = self.decode(quantized)
        against = "fp32" if targets is None else "targets"
        truth = self.as_targets(ref) if targets is None else targets
        if len(truth) != len(ref):
            raise ValueError(f"decode gave {len(ref)} predictions for {len(truth)} targets; expected one per record")
        for side, predictions in (("fp32", ref), ("quantized", test)):
            _add(self.state[side], self.score(predictions, truth))
        self.state["records"] += len(ref)
        self.state["against"] = self.state["against"] or against

    def merge(self, other: TaskMetric) -> None:
        """Add ``other``'s sums (same class, same options)."""
        for side in SIDES:
            _add(self.state[side], other.state[side])
        self.state["records"] += other.state["records"]
        self.state["against"] = self.state["against"] or other.state["against"]

    def compute(self) -> dict[str, dict[str, float | None]]:
        return {side: self.finish(self.state[side]) for side in SIDES}


def _add(sums: dict[str, Any], share: Mapping[str, int | float]) -> None:
    for key, value in share.items():
        value = int(value) if isinstance(value, int) or float(value).is_integer() else float(value)
        sums[key] = sums.get(key, 0) + value


def ratio(numerator: int | float, denominator: int | float) -> float | None:
    """``numerator / denominator``, or None when there is nothing to divide by."""
    return None if not denominator else float(numerator) / float(denominator)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task metric as configured: its path (import path, entry point or built-in name) and its
    constructor options (JSON text, so that the spec is hashable and pickles). ``folder`` is the
    directory of the file that declared it (a suite file, a test module): a module there that is not
    on ``sys.path`` is imported from it, the way pytest imports a ``conftest.py``."""

    path: str
    options: str = "{}"
    folder: str = field(default="", compare=False)

    @classmethod
    def parse(cls, value: object) -> TaskSpec:
        """``"pkg.mod:Class"`` or ``{"metric": "pkg.mod:Class", <option>: <value>, ...}``; ValueError why not."""
        if isinstance(value, TaskSpec):
            return value
        if isinstance(value, str) and value.strip():
            return cls(value.strip())
        if isinstance(value, Mapping):
            options = {str(k): v for k, v in value.items() if k != "metric"}
            path = value.get("metric")
            if isinstance(path, str) and path.strip():
                try:
                    return cls(path.strip(), json.dumps(options, sort_keys=True))
                except (TypeError, ValueError) as exc:  # ValueError: a table that holds itself
                    raise ValueError(f"task metric {path!r}: options must be plain values ({exc})") from None
        raise ValueError(f"expected 'module:Class' or a table with 'metric' and options, got {value!r}")

    @property
    def kwargs(self) -> dict[str, Any]:
        """The constructor's options (:data:`SUFFIX` is the plugin's, not the metric's)."""
        return {k: v for k, v in json.loads(self.options).items() if k != SUFFIX}

    @property
    def suffix(self) -> str | None:
        return json.loads(self.options).get(SUFFIX)

    def value_names(self, metric: Any) -> dict[str, str]:
        """The names the plugin gives ``metric``'s values (``cer``, or ``cer_line`` with suffix ``line``)
        -> the metric's own names."""
        return {(f"{name}_{self.suffix}" if self.suffix else name): name for name in metric.higher_is_better}

    @property
    def label(self) -> str:
        """How messages name the metric: its path, with options when it has some."""
        kwargs = self.kwargs
        return self.path + (f"({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})" if kwargs else "")

    def resolve(self) -> type:
        """The class (or factory) the path names, checked (:func:`check_task_class`); ValueError why not."""
        target = BUILTIN.get(self.path) or _entry_point(self.path) or self.path
        module_name, _, attribute = target.partition(":")
        if not module_name or not attribute:
            raise ValueError(f"task metric '{self.path}': expected 'module:Class', an entry point or {_builtins()}")
        try:
            module = _import(module_name, self.folder)
        except Exception as exc:  # a user's module can raise anything while importing
            raise ValueError(f"task metric '{self.path}': cannot import '{module_name}' ({_one_line(exc)})") from None
        found: Any = module
        for part in attribute.split("."):
            found = getattr(found, part, None)
            if found is None:
                raise ValueError(f"task metric '{self.path}': module '{module_name}' has no '{attribute}'")
        check_task_class(found, self.path)
        return found

    def create(self) -> Any:
        """A fresh instance with the options; ValueError names the metric and what is wrong."""
        cls = self.resolve()
        try:
            metric = cls(**self.kwargs)
        except Exception as exc:
            raise ValueError(f"task metric '{self.label}': cannot create it ({_one_line(exc)})") from None
        names = getattr(metric, "higher_is_better", None)
        if not isinstance(names, Mapping) or not names:
            raise ValueError(f"task metric '{self.path}': higher_is_better must map each value name to True/False")
        bad = [n for n in names if not isinstance(n, str) or not _VALUE_NAME.match(n)]
        if bad:
            raise ValueError(f"task metric '{self.path}': value names must be lower-case identifiers, got {bad}")
        if self.suffix is not None and not (isinstance(self.suffix, str) and _VALUE_NAME.match(self.suffix)):
            raise ValueError(
                f"task metric '{self.label}': {SUFFIX} must be a lower-case identifier, got {self.suffix!r}"
            )
        return metric


def check_task_class(cls: Any, path: str = "") -> None:
    """ValueError unless ``cls`` has every method of the protocol (:data:`REQUIRED`)."""
    missing = [name for name in REQUIRED if not callable(getattr(cls, name, None))]
    if missing:
        name = path or getattr(cls, "__qualname__", repr(cls))
        methods = ", ".join(repr(m) for m in missing)
        raise ValueError(f"task metric '{name}' has no method {methods} (a task metric needs {', '.join(REQUIRED)})")


def parse_task_specs(values: object) -> tuple[TaskSpec, ...]:
    """A list of metrics (strings or tables) as specs, each resolved and created once to check it;
    ValueError for the first bad one. Two metrics giving the same value name are an error too."""
    if isinstance(values, (str, Mapping)):
        values = [values]
    if not isinstance(values, Sequence):
        raise ValueError(f"expected a list of task metrics, got {values!r}")
    specs = tuple(TaskSpec.parse(v) for v in values)
    seen: dict[str, str] = {}
    for spec in specs:
        for name in spec.value_names(spec.create()):
            if name in seen:
                raise ValueError(f"task metrics '{seen[name]}' and '{spec.label}' both compute '{name}'")
            seen[name] = spec.label
    return specs


def _import(module_name: str, folder: str) -> Any:
    """``module_name`` from ``sys.path``, else its top-level module from ``folder`` (``<top>.py`` or a
    package ``<top>/``), registered in ``sys.modules`` under its name without touching ``sys.path``."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.partition(".")[0]
        if not folder or exc.name != top:
            raise
        candidates = [Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py"]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise
        package = [str(found.parent)] if found.name == "__init__.py" else None
        spec = importlib.util.spec_from_file_location(top, found, submodule_search_locations=package)
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[top]
            raise
        return importlib.import_module(module_name)


def _entry_point(name: str) -> str | None:
    if ":" in name:
        return None
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINTS) if ep.name == name]
    return found[0].value if found else None


def _builtins() -> str:
    return "a built-in name (" + ", ".join(BUILTIN) + ")"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
