"""The declared dependencies: every lower bound is what .ci/constraints-oldest.txt pins and CI tests.

The oldest run installs the library and its ``test`` extra; the ``mutation`` and ``corpus`` extras are
tools with their own pins (a mutation tool's major version, the model packages of the corpus).
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_qaccuracy.plugin.ini import load_toml

ROOT = Path(__file__).resolve().parents[1]


def _lower_bounds() -> dict[str, str]:
    project = load_toml(ROOT / "pyproject.toml")["project"]
    specs = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    bounds = {}
    for spec in specs:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(?:\s*;.*)?", spec)
        assert match, f"{spec}: every dependency has one lower bound (name>=version)"
        bounds[match[1].lower()] = match[2]
    return bounds


def test_oldest_constraints_pin_every_lower_bound() -> None:
    lines = (ROOT / ".ci" / "constraints-oldest.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line.strip() and not line.startswith("#"))
    bounds = _lower_bounds()
    assert pins.keys() == bounds.keys()
    for name, version in bounds.items():
        assert pins[name].split(".")[: len(version.split("."))] == version.split("."), name
        assert all(part == "0" for part in pins[name].split(".")[len(version.split(".")) :]), name
