"""pytest-xdist: ``-n 2`` gives the same summary, artifacts and JUnit properties as a serial run."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .conftest import PAIRS_MODULE, SUITE


def _summary_block(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "quantization accuracy summary" in line)
    end = next(i for i in range(start, len(lines)) if "pairs passed" in lines[i])
    return lines[start : end + 1]


def _artifacts(root: Path) -> dict[str, object]:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()
            if path.name == "summary.json":
                data.pop("created")
                for pair in data["pairs"]:  # what each pair's analysis took is the run's own
                    (pair["sensitivity"] or {}).pop("seconds", None)
            if path.name == "report.html":  # the Environment section's date is the run's own
                data = re.sub(r'\["created \(UTC\)","[^"]*"\]', "[]", str(data))
            files[path.relative_to(root).as_posix()] = data
    return files


def _properties(xml: Path) -> dict[str, dict[str, str]]:
    cases = ET.parse(xml).iter("testcase")
    return {
        f"{c.get('classname')}::{c.get('name')}": {p.get("name"): p.get("value") for p in c.iter("property")}
        for c in cases
    }


def test_xdist_matches_serial_run(digits: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    digits.makepyfile(test_pairs=PAIRS_MODULE)
    digits.makefile(".toml", qaccuracy_models=SUITE)
    serial = digits.runpytest_subprocess(
        "--qaccuracy-artifacts-dir=serial", "--junitxml=serial.xml", "-p", "no:randomly"
    )
    parallel = digits.runpytest_subprocess("-n", "2", "--qaccuracy-artifacts-dir=parallel", "--junitxml=parallel.xml")
    serial.assert_outcomes(passed=4, failed=3)
    parallel.assert_outcomes(passed=4, failed=3)
    assert _summary_block(serial)[:-1] == _summary_block(parallel)[:-1]
    assert _summary_block(parallel)[-1].startswith("2 / 4 pairs passed; artifacts in")
    first, second = _artifacts(digits.path / "serial"), _artifacts(digits.path / "parallel")
    assert sorted(first) == sorted(second)
    assert first == second
    assert len([name for name in first if name.startswith("pairs/") and name.endswith(".comparison.json")]) == 4
    props = _properties(digits.path / "parallel.xml")
    assert props == _properties(digits.path / "serial.xml")
    assert props["qaccuracy_models.toml.qdq::max_top1_drop"]["qaccuracy.pair"] == "qdq"
    assert float(props["test_pairs::test_good"]["qaccuracy.logits.cosine"]) > 0.999
    assert "INTERNALERROR" not in parallel.stdout.str()


def test_payload_is_plain_builtins(digits: pytest.Pytester) -> None:
    """What a worker sends must survive JSON (execnet refuses numpy scalars)."""
    digits.makepyfile(
        """
        import json
        from pytest_qaccuracy.plugin.fixtures import session_key

        def walk(value):
            assert type(value) in (dict, list, str, int, float, bool, type(None)), type(value)
            for item in value.values() if type(value) is dict else value if type(value) is list else ():
                walk(item)

        def test_payload(qaccuracy, qaccuracy_pair, request):
            pair = qaccuracy_pair("models/digits_cnn.onnx", "models/digits_cnn.qdq.onnx", "data/digits_test.npz")
            qaccuracy.check(pair, rtol=1.0, atol=1.0, max_top1_drop=0.01)
            payload = request.config.stash[session_key].payload()
            assert json.loads(json.dumps(payload, allow_nan=False)) == payload
            walk(payload)
        """
    )
    digits.runpytest().assert_outcomes(passed=1)
