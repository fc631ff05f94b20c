"""Pin which way the int16 pair correction of a convolution is computed, for tests of every way."""

from __future__ import annotations

import pytest

from pytest_qaccuracy.backend.kernels import conv_pairs


def force_way(monkeypatch: pytest.MonkeyPatch, way: str) -> list[str]:
    """Make every correction ``"dense"`` (every risky pair at every output; ``"dense-blocks"``: in blocks
    of entries even where a chunk is small), ``"sparse"`` (candidates first: no small-layer shortcut,
    and a sampled hit costs nothing); returns the list that records which way each call took
    (``"_dense"`` for both dense forms, or ``"_sparse"``)."""
    if way == "sparse":
        monkeypatch.setattr(conv_pairs, "DENSE_DIRECT", -1)
        monkeypatch.setattr(conv_pairs, "DENSE_ENTRIES_PER_PAIR", -1)
        monkeypatch.setattr(conv_pairs, "SPARSE_HIT_COST", 0)
        monkeypatch.setattr(conv_pairs, "SPARSE_FIXED", -1)
        monkeypatch.setattr(conv_pairs, "SCAN_COST", 0)
    elif way in ("dense", "dense-blocks"):
        monkeypatch.setattr(conv_pairs, "DENSE_DIRECT", 10**12)
        if way == "dense-blocks":  # the blocked form, not the few-calls form of small chunks
            monkeypatch.setattr(conv_pairs, "SMALL_EVALUATIONS", -1)
    else:
        raise ValueError(f"way must be 'dense', 'dense-blocks' or 'sparse', got {way!r}")
    taken: list[str] = []
    for name in ("_dense", "_sparse"):
        real = getattr(conv_pairs, name)
        monkeypatch.setattr(
            conv_pairs, name, lambda *a, _real=real, _name=name, **k: (taken.append(_name), _real(*a, **k))[1]
        )
    return taken


def recorded(way: str) -> str:
    """The name :func:`force_way`'s list records for a call of ``way``."""
    return {"dense": "_dense", "sparse": "_sparse"}.get(way.split("-")[0], way)
