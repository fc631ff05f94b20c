"""The corpus of real public models (scripts/build_corpus.py), built once and shared by xdist workers.

Every test here carries the ``corpus`` marker and runs only when selected with ``-m corpus`` (``.ci/corpus``):
the corpus costs minutes. Without the ``corpus`` extra installed the tests skip, naming it.
"""

from __future__ import annotations

import fcntl
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the test modules import corpus_helpers

from corpus_helpers import Entry, build_corpus


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Corpus tests run only when ``-m`` names the marker: the default run stays fast."""
    if "corpus" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="real-model corpus: run with -m corpus (.ci/corpus)")
    for item in items:
        if item.get_closest_marker("corpus"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def corpus() -> Iterator[dict[str, Entry]]:
    """Every corpus model, built (or reused from ``$QACCURACY_CORPUS_DIR``, default ``.corpus/``) under a lock."""
    missing = build_corpus.missing_packages()
    if missing:
        pytest.skip(f"needs the corpus extra: pip install -e '.[corpus]' (missing: {', '.join(missing)})")
    root = build_corpus.default_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:  # xdist workers wait for the one that builds
        fcntl.flock(lock, fcntl.LOCK_EX)
        folders = build_corpus.build(root)
        fcntl.flock(lock, fcntl.LOCK_UN)
    yield {
        name: Entry(name, folder, json.loads((folder / "model.json").read_text())) for name, folder in folders.items()
    }
