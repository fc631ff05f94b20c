"""Where a pair's quantized model runs (backend, scheme), and the agreement gate ``max_backend_steps``.

``qaccuracy_backend`` is ``onnxruntime`` (default) or ``integer`` (the emulated integer backend);
``qaccuracy_scheme`` is a preset of :data:`pytest_qaccuracy.backend.scheme.PRESETS` (default
``onnxruntime``). With ``max_backend_steps = N``, a check streams the pair's dataset through
:class:`~pytest_qaccuracy.backend.agreement.AgreementChecker` with the pair's scheme and fails with
the first tensor, in topological order, that differs from onnxruntime by more than N steps. The
gate compares the *scheme* with onnxruntime whatever the pair's backend: with the default backend it
still asks "would target <scheme> agree with what onnxruntime ran?".

Only stdlib and pytest at module level.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from pytest_qaccuracy.plugin.ini import ini_lines, ini_text

#: The backends of :func:`pytest_qaccuracy.runtime.make_runner` and the scheme presets of
#: :data:`pytest_qaccuracy.backend.scheme.PRESETS`, named here because options are checked at configure
#: time, which runs for every pytest invocation: importing ``runtime`` loads onnx, and importing the
#: ``backend`` package loads numpy and every kernel. A test checks that both lists match.
BACKENDS = ("onnxruntime", "integer")
SCHEMES = (
    "onnxruntime",
    "onnxruntime-avx2",
    "onnxruntime-vnni",
    "onnx-reference",
    "tflite",
    "tflite-single-rounding",
    "tvm-upward",
    "power2",
    "glow",
)
DEFAULT_BACKEND = "onnxruntime"
DEFAULT_SCHEME = "onnxruntime"
#: The tolerance of the agreement gate (a key of ``rules.TOLERANCES``).
GATE = "max_backend_steps"
#: Diverging tensors listed in a failure message after the first one.
SHOW_TENSORS = 5


def check_backend(value: object) -> str:
    """``value`` if it names a backend; ValueError naming the key and the backends otherwise."""
    if value not in BACKENDS:
        raise ValueError(f"backend: unknown backend {value!r} (known: {', '.join(BACKENDS)})")
    return str(value)


def check_scheme(value: object) -> str:
    """``value`` if it names a scheme preset; ValueError naming the key and the presets otherwise."""
    if value not in SCHEMES:
        raise ValueError(f"scheme: unknown scheme {value!r} (presets: {', '.join(SCHEMES)})")
    return str(value)


def check_targets(value: object) -> tuple[str, ...]:
    """Deployment targets: scheme presets as a list, or one string separated by commas or spaces.

    ValueError naming the key otherwise. Duplicates are dropped, the order is kept.
    """
    if isinstance(value, str):
        names: list[object] = [n for n in re.split(r"[\s,]+", value) if n]
    elif isinstance(value, list | tuple):
        names = list(value)
    else:
        raise ValueError(f"targets: expected a list of scheme presets, got {value!r}")
    for name in names:
        if name not in SCHEMES:
            raise ValueError(f"targets: unknown scheme {name!r} (presets: {', '.join(SCHEMES)})")
    return tuple(dict.fromkeys(str(n) for n in names))


def add_backend_options(parser: pytest.Parser, group: pytest.OptionGroup) -> None:
    """Declare ``--qaccuracy-backend``/``qaccuracy_backend`` and ``--qaccuracy-scheme``/``qaccuracy_scheme``."""
    backend_help = f"Backend running the quantized model: {' or '.join(BACKENDS)} (default {DEFAULT_BACKEND})"
    scheme_help = f"Integer scheme preset of the integer backend and of {GATE} (default {DEFAULT_SCHEME})"
    group.addoption("--qaccuracy-backend", dest="qaccuracy_backend", default=None, metavar="NAME", help=backend_help)
    parser.addini("qaccuracy_backend", backend_help, default=None)
    group.addoption("--qaccuracy-scheme", dest="qaccuracy_scheme", default=None, metavar="PRESET", help=scheme_help)
    parser.addini("qaccuracy_scheme", scheme_help, default=None)
    targets_help = (
        "Deployment targets every pair's output checks also run on, e.g. 'onnxruntime-avx2 onnxruntime-vnni' "
        "(scheme presets; this machine's own runs on onnxruntime, the others on the integer backend)"
    )
    group.addoption("--qaccuracy-targets", dest="qaccuracy_targets", default=None, metavar="PRESETS", help=targets_help)
    parser.addini("qaccuracy_targets", targets_help, type="linelist", default=[])


def read_backend(config: pytest.Config) -> tuple[str, str]:
    """``(backend, scheme)`` from the command line, else the ini file; ``pytest.UsageError`` if unknown."""
    found = []
    for name, check, default in (("backend", check_backend, DEFAULT_BACKEND), ("scheme", check_scheme, DEFAULT_SCHEME)):
        cli = config.getoption(f"qaccuracy_{name}")
        value = cli if cli is not None else ini_text(config, f"qaccuracy_{name}")
        try:
            found.append(check(default if value is None else value))
        except ValueError as exc:
            where = f"--qaccuracy-{name}" if cli is not None else f"qaccuracy_{name}"
            raise pytest.UsageError(f"{where}: {str(exc).split(': ', 1)[1]}") from None
    return found[0], found[1]


def read_targets(config: pytest.Config) -> tuple[str, ...]:
    """``qaccuracy_targets`` from the command line, else the ini file; ``pytest.UsageError`` if unknown."""
    cli = config.getoption("qaccuracy_targets")
    value = cli if cli is not None else " ".join(ini_lines(config, "qaccuracy_targets"))
    try:
        return check_targets(value)
    except ValueError as exc:
        where = "--qaccuracy-targets" if cli is not None else "qaccuracy_targets"
        raise pytest.UsageError(f"{where}: {str(exc).split(': ', 1)[1]}") from None


def gate_outcome(agreement: Any, source: str) -> Any:
    """The :class:`~pytest_qaccuracy.plugin.checks.Outcome` of one ``AgreementResult``."""
    from pytest_qaccuracy.plugin.checks import Outcome

    n, scheme = agreement.max_steps_allowed, agreement.scheme
    rule = f"integer emulation ({scheme}) within {_steps(n)} of onnxruntime"
    metric = "steps vs onnxruntime"
    if not agreement.tensors:
        detail = f"{rule}: the model has no 8-bit tensors to compare"
        return Outcome(GATE, "integer tensors", metric, "<=", float(n), None, False, source, detail)
    if agreement.ok:
        worst = max(t.max_steps for t in agreement.tensors)
        detail = f"{rule}: ok on {len(agreement.tensors)} tensors (max {_steps(worst)})"
        target = f"{len(agreement.tensors)} integer tensors ({scheme})"
        return Outcome(GATE, target, metric, "<=", float(n), float(worst), True, source, detail)
    bad = next(t for t in agreement.tensors if t.tensor == agreement.first_divergence)
    target = f"tensor '{bad.tensor}' ({scheme})"
    if bad.max_steps < 0:
        detail = f"{rule}: tensor '{bad.tensor}' (order {bad.order}) has another shape on onnxruntime"
        return Outcome(GATE, target, metric, "<=", float(n), None, False, source, detail)
    share = 100.0 * bad.mismatches / max(bad.elements, 1)
    detail = (
        f"{rule}: tensor '{bad.tensor}' (order {bad.order}) differs by up to {_steps(bad.max_steps)}, "
        f"{bad.mismatches} / {bad.elements} elements ({share:.3g}%)"
    )
    return Outcome(GATE, target, metric, "<=", float(n), float(bad.max_steps), False, source, detail)


def gate_notes(agreement: Any) -> list[str]:
    """Message lines after the first divergence: the next diverging tensors, then the totals."""
    if agreement.ok:
        return []
    n = agreement.max_steps_allowed
    after = [t for t in agreement.tensors if t.max_steps > n or t.max_steps < 0][1:]  # [0] is the first line
    lines = [f"Next diverging tensors (> {_steps(n)}):"] if after else []
    for t in after[:SHOW_TENSORS]:
        shape = "another shape" if t.max_steps < 0 else _steps(t.max_steps)
        lines.append(f" {t.tensor} (order {t.order}): {shape}, {t.mismatches} / {t.elements} elements")
    if len(after) > SHOW_TENSORS:
        lines.append(f" ... and {len(after) - SHOW_TENSORS} more")
    worst = max(agreement.tensors, key=lambda t: t.max_steps)
    lines.append(
        f"Tensors that differ: {agreement.num_mismatched_tensors} / {len(agreement.tensors)}; "
        f"max {_steps(worst.max_steps)} at '{worst.tensor}' ({agreement.records} records)"
    )
    return lines


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def gate_properties(agreement: Any) -> list[tuple[str, str]]:
    """JUnit properties of the gate: plain strings."""
    worst = max((t.max_steps for t in agreement.tensors), default=0)
    return [
        ("qaccuracy.agreement.scheme", agreement.scheme),
        ("qaccuracy.agreement.max_steps", str(worst)),
        ("qaccuracy.agreement.first_divergence", agreement.first_divergence or ""),
    ]


def agreement_record(agreement: Any) -> dict[str, Any]:
    """The measurement for ``summary.json`` (builtins); the verdict per N is in the pair's checks."""
    data: Mapping[str, Any] = agreement.to_dict()
    return {k: v for k, v in data.items() if k not in ("max_steps_allowed", "first_divergence")}


__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "DEFAULT_SCHEME",
    "GATE",
    "SCHEMES",
    "add_backend_options",
    "agreement_record",
    "check_backend",
    "check_scheme",
    "check_targets",
    "gate_notes",
    "gate_outcome",
    "gate_properties",
    "read_backend",
    "read_targets",
]
