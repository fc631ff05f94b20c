"""onnxruntime releases an onnxruntime preset can be pinned to: ``onnxruntime-arm64-neon@1.28``.

The ``onnxruntime`` presets compute as the installed onnxruntime does; a device that runs another
release is named ``PRESET@MAJOR.MINOR`` (a patch number is allowed and ignored). Pure: stdlib only, so
that options can be checked at configure time.
"""

from __future__ import annotations

import re

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
