"""The scheme presets' names, the one list of them, and the onnxruntime release a name may pin.

The backend defines each preset (:data:`pytest_qaccuracy.backend.scheme.PRESETS`, checked against
:data:`NAMES` by a test); the plugin's options, the recipe search's targets and the host probe read
the names from here. The ``onnxruntime`` presets compute as the installed onnxruntime does; a device
that runs another release is named ``PRESET@MAJOR.MINOR`` (``onnxruntime-arm64-neon@1.28``; a patch
number is allowed and ignored). Pure: stdlib only, so that options can be checked at configure time
(importing the backend loads numpy and every kernel).
"""

from __future__ import annotations

import re

#: the preset that means "the onnxruntime of this machine", resolved by ``backend.host.host_preset``
HOST = "onnxruntime"
#: onnxruntime's CPU families, one of which :data:`HOST` resolves to
HOST_FAMILIES = ("onnxruntime-avx2", "onnxruntime-vnni", "onnxruntime-arm64", "onnxruntime-arm64-neon")
#: every preset name, :data:`HOST` first
NAMES = (
    HOST,
    *HOST_FAMILIES,
    "onnx-reference",
    "tflite",
    "tflite-single-rounding",
    "tvm-upward",
    "power2",
    "glow",
)

#: the oldest release the presets were measured against (pyproject.toml's lower bound)
OLDEST = (1, 18)
_PINNED = re.compile(r"(?P<preset>[^@]+)@(?P<major>\d+)\.(?P<minor>\d+)(?:\.\d+)?")


def split_release(name: str) -> tuple[str, tuple[int, int] | None]:
    """``(preset, (major, minor))`` of ``PRESET@MAJOR.MINOR``; ``(name, None)`` without ``@``.

    Raises:
        ValueError: a release that is not ``MAJOR.MINOR``, is older than :data:`OLDEST`, or is given to
            a preset that is not onnxruntime's (the message says which).
    """
    if "@" not in name:
        return name, None
    found = _PINNED.fullmatch(name)
    if found is None:
        raise ValueError(f"{name!r}: expected PRESET@MAJOR.MINOR, e.g. onnxruntime-arm64-neon@1.28")
    preset, release = found["preset"], (int(found["major"]), int(found["minor"]))
    if not preset.startswith("onnxruntime"):
        raise ValueError(f"{name!r}: only onnxruntime's presets follow its releases")
    if release < OLDEST:
        oldest = ".".join(map(str, OLDEST))
        raise ValueError(f"{name!r}: onnxruntime releases before {oldest} are not emulated")
    return preset, release
