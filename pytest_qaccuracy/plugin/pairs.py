"""A model pair as the plugin knows it: its files, where its quantized model runs, its identity.

:class:`PairSpec` is made by the fixtures, the marker and suites (:func:`~.fixtures.make_spec`),
cached and checked by the session, and named by its :meth:`~PairSpec.key` and :meth:`~PairSpec.stem`
in records, artifacts and baselines. Only stdlib at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_qaccuracy.plugin.schemes import DEFAULT_BACKEND, DEFAULT_SCHEME
from pytest_qaccuracy.report.artifacts import artifact_stem


@dataclass(frozen=True, slots=True)
class PairSpec:
    """What a pair is made of; paths are absolute."""

    id: str
    fp32: Path
    quantized: Path
    data: Path
    labels: Path | None = None
    mapping: tuple[tuple[str, str], ...] = ()
    metrics: tuple[str, ...] = ()
    backend: str = DEFAULT_BACKEND
    scheme: str = DEFAULT_SCHEME
    #: deployment targets (scheme presets) whose output checks run besides the pair's own run
    targets: tuple[str, ...] = ()
    #: the output top-k counts (``"logits"`` or ``"logits:1"``); None: every (records, classes) output
    scores: str | None = None
    #: named views of outputs, each a :class:`~pytest_qaccuracy.analysis.slices.SliceSpec`
    slices: tuple[Any, ...] = ()
    #: task metrics, each a :class:`~pytest_qaccuracy.metrics.task.TaskSpec` (the ini's, then the pair's)
    task_metrics: tuple[Any, ...] = ()
    #: a JSON-lines file of task targets; None: the dataset's targets, else its labels, else none
    task_targets: Path | None = None

    def key(self, root: Path) -> str:
        """A stable identity across runs and machines: the id, the paths relative to ``root``, and the
        backend and scheme when not the defaults (so existing keys, stems and baselines stay valid)."""
        files = (self.fp32, self.quantized, self.data, self.labels)
        parts = [self.id, *(_relative(p, root) for p in files if p)]
        if self.task_targets is not None:
            parts.append(f"task_targets={_relative(self.task_targets, root)}")
        for name, value, default in (
            ("backend", self.backend, DEFAULT_BACKEND),
            ("scheme", self.scheme, DEFAULT_SCHEME),
        ):
            if value != default:
                parts.append(f"{name}={value}")
        return "|".join(parts)

    def stem(self, root: Path) -> str:
        """The stem of the pair's artifacts and baseline (:func:`~pytest_qaccuracy.report.artifacts.artifact_stem`)."""
        return artifact_stem(self.id, self.key(root))

    def on_target(self, target: str) -> tuple[PairSpec, str]:
        """The pair as it runs on ``target`` (a scheme preset), and the target's resolved name.

        This machine's own target runs on onnxruntime itself (when the pair runs there); any other
        on the integer backend with that preset.
        """
        from pytest_qaccuracy.backend.host import host_preset
        from pytest_qaccuracy.backend.scheme import get_scheme

        name = get_scheme(target).name
        if name == host_preset() and self.backend == "onnxruntime":
            return replace(self, targets=(), scheme=DEFAULT_SCHEME), name
        return replace(self, targets=(), backend="integer", scheme=name), name

    @property
    def compare_scheme(self) -> str | None:
        """The scheme the comparison runs with: the pair's on the integer backend, none on onnxruntime."""
        return self.scheme if self.backend == "integer" else None


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
