"""The kernel registry: ``@kernel(domain, op_type, since=opset)`` on a plain function.

A kernel's signature is the ONNX signature: inputs positional in spec order (``None`` for an absent
optional input), attributes keyword-only with their spec defaults. Kernels that need the scheme
declare ``scheme=True`` and receive it as the keyword ``scheme``. A kernel returns a tuple.

The modules under mutation testing (``scripts/mutation.py``) call ``kernel(...)(fn)`` after the
function instead of decorating it: mutmut 3 leaves every decorated function unmutated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_qaccuracy.errors import UnsupportedOpError

#: Private domain of the internal ops that QDQ fusion creates (requantize tables).
INTERNAL_DOMAIN = "ai.qaccuracy"

KernelFn = Callable[..., tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Kernel:
    """A registered kernel."""

    domain: str
    op_type: str
    since: int
    fn: KernelFn
    needs_scheme: bool
    float_op: bool
    needs_outputs: bool


class NotHandled(Exception):
    """Raised by a kernel for a case it leaves to the ``onnx.reference`` fallback (e.g. a rare mode)."""


_REGISTRY: dict[tuple[str, str], list[Kernel]] = {}


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def kernel(
    domain: str,
    op_type: str,
    since: int = 1,
    *,
    scheme: bool = False,
    float_op: bool = False,
    outputs: bool = False,
) -> Callable[[KernelFn], KernelFn]:
    """Register ``fn`` as the kernel of ``(domain, op_type)`` from opset ``since`` on.

    ``scheme=True``: the kernel takes the scheme as keyword ``scheme``. ``float_op=True``: a float
    kernel, replaced by ``onnx.reference`` when the scheme says ``float_kernels="reference"``.
    ``outputs=True``: the kernel takes the node's output count as keyword ``n_outputs``.

    Raises:
        ValueError: the same ``(domain, op_type, since)`` is registered twice.
    """

    def register(fn: KernelFn) -> KernelFn:
        versions = _REGISTRY.setdefault((normalize_domain(domain), op_type), [])
        if any(k.since == since for k in versions):
            raise ValueError(f"kernel {domain or 'ai.onnx'}::{op_type} (since {since}) registered twice")
        versions.append(Kernel(normalize_domain(domain), op_type, since, fn, scheme, float_op, outputs))
        versions.sort(key=lambda k: k.since)
        return fn

    return register


def find_kernel(domain: str, op_type: str, opset: int) -> Kernel | None:
    """The newest kernel whose ``since`` does not exceed ``opset``, or ``None``."""
    versions = _REGISTRY.get((normalize_domain(domain), op_type), [])
    usable = [k for k in versions if k.since <= opset]
    return usable[-1] if usable else None


def available(domain: str | None = None) -> list[str]:
    """Names of the registered kernels (``domain::op``), sorted."""
    return sorted(f"{d or 'ai.onnx'}::{op}" for (d, op) in _REGISTRY if domain is None or d == normalize_domain(domain))


def unsupported(node_name: str, domain: str, op_type: str, opset: int, reason: str = "") -> UnsupportedOpError:
    """The error for an op without a kernel: names node, op, domain and opset, lists what exists."""
    known = ", ".join(op.split("::")[1] for op in available(domain)) or "none"
    extra = f" ({reason})" if reason else ""
    return UnsupportedOpError(
        f"node '{node_name}': no integer-backend kernel for {domain or 'ai.onnx'}::{op_type} at opset {opset}"
        f"{extra}; kernels in this domain: {known}"
    )
