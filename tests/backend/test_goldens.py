"""Both x86 CPU families, on any host: the recorded AVX2 goldens and the host's own onnxruntime.

``goldens/onnxruntime-avx2/`` holds 125 small quantized models with the outputs that onnxruntime 1.32.0
computed on an x86 CPU with AVX2 and no VNNI (see its README and ``manifest.json``). They check the
``onnxruntime-avx2`` preset bit for bit wherever the tests run. The host's onnxruntime checks the
``onnxruntime`` preset, which the probe resolves to this machine's family.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pytest_qaccuracy.backend import IntegerSession, Scheme, get_scheme
from pytest_qaccuracy.backend.host import host_preset
from pytest_qaccuracy.backend.scheme import for_onnxruntime
from pytest_qaccuracy.presets import HOST_FAMILIES

GOLDENS = Path(__file__).parent / "goldens" / "onnxruntime-avx2"
MANIFEST = json.loads((GOLDENS / "manifest.json").read_text())
CASES = {case["case"]: case for case in MANIFEST["cases"]}


def _pairs_products(case: dict) -> bool:
    """A u8 x s8 kernel that sums products in pairs: not depthwise (one channel in and out per group),
    not ConvInteger, not s8s8 or u8u8 (read off the manifest's note)."""
    note = case["note"]
    if not ("u8i8" in note or "u8s8" in note) or note.startswith("ConvInteger"):
        return False
    fields = dict(part.split("=", 1) for part in note.split() if "=" in part)
    return not ("group" in fields and fields["group"] == fields["cin"] == fields["cout"] != "1")


PAIRED = {name for name, case in CASES.items() if _pairs_products(case)}


#: the release that recorded the goldens: the presets are checked as it computes, whatever is installed
RECORDED = tuple(int(part) for part in MANIFEST["onnxruntime"].split(".")[:2])


def _scheme(case: dict, preset: str) -> Scheme:
    """The preset as the case's session ran it: ``session.qdqisint8allowed=1`` keeps int8 activations;
    ``onnxruntime`` is this machine's (its release), the named presets the recording release's."""
    scheme = get_scheme(preset) if preset == "onnxruntime" else for_onnxruntime(get_scheme(preset), RECORDED)
    if case.get("session_config", {}).get("session.qdqisint8allowed") == "1":
        scheme = scheme.replace(name=scheme.name, qdq_int8_to_uint8=False)
    return scheme


def _emulate(name: str, scheme: Scheme) -> dict[str, np.ndarray]:
    """Outputs of the integer backend; whole nets record by record (batch 1), as the goldens were made."""
    folder = GOLDENS / name
    feeds = dict(np.load(folder / "inputs.npz"))
    session = IntegerSession(str(folder / "model.onnx"), scheme=scheme, threads=1)
    names = [o.name for o in session.get_outputs()]
    if not name.startswith("net"):
        return dict(zip(names, session.run(None, feeds), strict=True))
    records = next(iter(feeds.values())).shape[0]
    runs = [session.run(None, {k: v[i : i + 1] for k, v in feeds.items()}) for i in range(records)]
    return {n: np.concatenate([run[j] for run in runs]) for j, n in enumerate(names)}


def _mismatches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> int:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
    return sum(int(np.count_nonzero(got[n] != want[n])) for n in want)


def test_manifest_lists_every_recorded_case() -> None:
    assert len(CASES) == 125 == len([p for p in GOLDENS.iterdir() if p.is_dir()])
    assert "avx2" in MANIFEST["cpu_flags"] and not any("vnni" in f for f in MANIFEST["cpu_flags"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_avx2_preset_is_bit_exact_with_the_recorded_goldens(name: str) -> None:
    want = dict(np.load(GOLDENS / name / "outputs.npz"))
    assert _mismatches(_emulate(name, _scheme(CASES[name], "onnxruntime-avx2")), want) == 0


def test_vnni_preset_differs_from_the_goldens_only_where_pairs_saturate() -> None:
    """Exact int32 sums match every case but u8 x s8 kernels that pair products, and differ on every
    such single-kernel case (so the goldens tell the presets apart)."""
    differing = set()
    for name, case in CASES.items():
        want = dict(np.load(GOLDENS / name / "outputs.npz"))
        if _mismatches(_emulate(name, _scheme(case, "onnxruntime-vnni")), want):
            differing.add(name)
    default_sessions = {n for n in CASES if n.endswith("_default_session")}  # s8s8 run as u8 x s8
    assert differing <= PAIRED | default_sessions
    assert {n for n in PAIRED if not n.startswith("net")} | default_sessions <= differing


@pytest.mark.parametrize("name", sorted(CASES))
def test_host_preset_is_bit_exact_with_the_host_onnxruntime(name: str) -> None:
    """The probe's preset against this machine's own onnxruntime, on the same models (any x86 family)."""
    case = CASES[name]
    folder = GOLDENS / name
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for key, value in case.get("session_config", {}).items():
        options.add_session_config_entry(key, value)
    try:
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ConvInteger u8 x s8: no CPU kernel in onnxruntime 1.18 or 1.23 (1.32 has one)
        if "NOT_IMPLEMENTED" not in str(exc):
            raise
        pytest.skip(f"onnxruntime {ort.__version__} has no CPU kernel for this case: {str(exc).splitlines()[0]}")
    feeds = dict(np.load(folder / "inputs.npz"))
    names = [o.name for o in session.get_outputs()]
    if name.startswith("net"):
        records = next(iter(feeds.values())).shape[0]
        runs = [session.run(None, {k: v[i : i + 1] for k, v in feeds.items()}) for i in range(records)]
        want = {n: np.concatenate([run[j] for run in runs]) for j, n in enumerate(names)}
    else:
        want = dict(zip(names, session.run(None, feeds), strict=True))
    scheme = _scheme(case, "onnxruntime")
    assert scheme.name == host_preset() in HOST_FAMILIES
    assert _mismatches(_emulate(name, scheme), want) == 0
