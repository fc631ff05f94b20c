"""Where a pair's quantized model runs: the backends and scheme presets a pair or an option may name.

``backend`` is ``onnxruntime`` (default) or ``integer`` (the emulated integer backend); ``scheme`` is
a preset of :data:`pytest_qaccuracy.presets.NAMES` (default ``onnxruntime``); ``targets`` are presets
whose output checks also run. The backends are listed here, not imported, because options are
checked at configure time, which runs for every pytest invocation: importing ``runtime`` loads onnx
(a test checks that both lists match). Pure: stdlib only.
"""

from __future__ import annotations

import re

from pytest_qaccuracy.presets import HOST, NAMES, split_release
from pytest_qaccuracy.tolerances import BadValue

#: The backends of :func:`pytest_qaccuracy.runtime.make_runner`.
BACKENDS = ("onnxruntime", "integer")
DEFAULT_BACKEND = "onnxruntime"
DEFAULT_SCHEME = HOST


def check_backend(value: object) -> str:
    """``value`` if it names a backend; :class:`BadValue` naming the key and the backends otherwise."""
    if value not in BACKENDS:
        raise BadValue("backend", f"unknown backend {value!r} (known: {', '.join(BACKENDS)})")
    return str(value)


def _known(key: str, value: object) -> str:
    """``value`` if it names a preset, or an onnxruntime preset pinned to a release
    (``onnxruntime-arm64-neon@1.28``, :mod:`pytest_qaccuracy.presets`); :class:`BadValue` otherwise."""
    try:
        preset, _ = split_release(value) if isinstance(value, str) else (value, None)
    except ValueError as exc:
        raise BadValue(key, str(exc)) from None
    if preset not in NAMES:
        raise BadValue(key, f"unknown scheme {value!r} (presets: {', '.join(NAMES)})")
    return str(value)


def check_scheme(value: object) -> str:
    """``value`` if it names a scheme preset; :class:`BadValue` naming the key and the presets otherwise."""
    return _known("scheme", value)


def check_targets(value: object) -> tuple[str, ...]:
    """Deployment targets: scheme presets as a list, or one string separated by commas or spaces.

    :class:`BadValue` naming the key otherwise. Duplicates are dropped, the order is kept.
    """
    if isinstance(value, str):
        names: list[object] = [n for n in re.split(r"[\s,]+", value) if n]
    elif isinstance(value, list | tuple):
        names = list(value)
    else:
        raise BadValue("targets", f"expected a list of scheme presets, got {value!r}")
    return tuple(dict.fromkeys(_known("targets", name) for name in names))


#: Pair keys naming where the quantized model runs, with their checks.
RUN_KEYS = {"backend": check_backend, "scheme": check_scheme, "targets": check_targets}
