"""A generated TOML suite per model, run by pytest itself: every form, the integer backend, top-k."""

from __future__ import annotations

import json

import pytest
from corpus_helpers import MODEL_NAMES, VARIANTS

pytestmark = pytest.mark.corpus


def _suite(entry, pairs: dict[str, dict], tolerances: dict[str, float] | None = None) -> str:
    """TOML text: defaults (the fp32 model and the test data) then one table per pair."""
    lines = ["[defaults]", f'fp32 = "{entry.fp32}"', f'data = "{entry.data()}"', ""]
    if tolerances:
        lines += ["[defaults.tolerances]", *(f"{k} = {v}" for k, v in tolerances.items()), ""]
    for pair, keys in pairs.items():
        lines.append(f"[pairs.{pair}]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in keys.items() if k != "tolerances"]
        if "tolerances" in keys:
            lines += [f"[pairs.{pair}.tolerances]", *(f"{k} = {v}" for k, v in keys["tolerances"].items())]
        lines.append("")
    return "\n".join(lines)


#: a failing pair's summary ranks its nodes (one run per node and record): on the largest graphs
#: (350-400 quantized nodes) that alone takes minutes, so it is left to test_sensitivity.py there
NO_SUMMARY_SENSITIVITY = ("ppocr_det", "ppocr_rec", "minilm_l3")


def _run(pytester: pytest.Pytester, name: str, text: str) -> tuple[pytest.RunResult, list[pytest.TestReport]]:
    pytester.makefile(".toml", **{f"qaccuracy_{name}": text})
    sensitivity = "off" if name in NO_SUMMARY_SENSITIVITY else "failed"
    options = ["-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:randomly"]
    options += [f"--qaccuracy-sensitivity={sensitivity}", "--qaccuracy-sensitivity-records=1"]
    result = pytester.runpytest_inprocess(*options)
    reports = result.reprec.getreports("pytest_runtest_logreport")
    return result, [r for r in reports if r.when == "call" or r.outcome != "passed"]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_suite(corpus, name, pytester):
    """QDQ and QOperator pairs with the default checks (cosine >= 0.99), and the integer backend gated at
    1 step of onnxruntime: every item passes, or fails with the check's message; nothing errors."""
    entry = corpus[name]
    pairs = {variant: {"quantized": str(entry.model(variant))} for variant in ("qdq_u8s8", "qop_u8s8")}
    for variant in ("qdq_u8s8", "qop_u8s8"):
        pairs[f"integer_{variant}"] = {
            "quantized": str(entry.model(variant)),
            "data": str(entry.data("smoke")),
            "backend": "integer",
            "scheme": "onnxruntime",
            "tolerances": {"max_backend_steps": 1},
        }
    result, reports = _run(pytester, name, _suite(entry, pairs))
    assert len({r.nodeid.split("::")[1] for r in reports}) == len(pairs), [r.nodeid for r in reports]
    for report in reports:
        assert report.when == "call", f"{report.nodeid}: {report.when} {report.outcome}\n{report.longreprtext}"
        if report.failed:  # a check's message, never an exception from inside the plugin
            assert "Traceback" not in report.longreprtext, report.longreprtext
            assert "pytest_qaccuracy/" not in report.longreprtext, report.longreprtext
    assert any("pairs passed" in line for line in result.outlines), result.outlines[-15:]


#: classifiers and their top-k tolerances: class scores (N, classes), an int64 label beside probabilities
#: (the float class-score output is picked), and a CTC recognizer's sequence (N, steps, classes), which
#: ``scores`` names, counted per time step
TOPK = {
    "ppocr_cls": ({"min_top1_agreement": 0.5, "max_top1_drop": 0.5}, {}),
    "digits_mlp": ({"min_top1_agreement": 0.5, "max_top1_drop": 0.5}, {}),
    "ppocr_rec": ({"min_top1_agreement": 0.01}, {"scores": "softmax_11.tmp_0"}),
}


@pytest.mark.parametrize("name", list(TOPK))
def test_topk(corpus, name, pytester):
    """Top-1 agreement (and accuracy drop where the data has labels) is counted on every form."""
    entry = corpus[name]
    tolerances, keys = TOPK[name]
    pairs = {variant: {"quantized": str(entry.model(variant)), **keys} for variant in VARIANTS}
    _, reports = _run(pytester, name, _suite(entry, pairs, {"min_cosine": 0.0, **tolerances}))
    failed = [f"{r.nodeid}: {r.longreprtext.splitlines()[0]}" for r in reports if not r.passed]
    assert not failed, "\n".join(failed)
    assert len(reports) == len(pairs) * (1 + len(tolerances)), [r.nodeid for r in reports]
    if "scores" in keys:  # passing pairs print their verdict only: how top-k counted is in summary.json
        summary = json.loads((pytester.path / ".qaccuracy" / "summary.json").read_text())
        counted = [t["counted"] for p in summary["pairs"] for t in p["topk"].values()]
        assert counted and all(c.startswith("per position") for c in counted), counted
