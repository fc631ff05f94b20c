"""Record onnxruntime's integer results on an ARM64 CPU as golden files (see README.md beside this file).

Two steps:
  python make_arm64_goldens.py cases                 (any host) writes the ARM-only cases under cases/
  python make_arm64_goldens.py record FAMILY [OUT]  (an ARM64 python with onnxruntime's aarch64 wheel, e.g.
                                                    under qemu-aarch64: .ci/arm64) runs every case with
                                                    onnxruntime's default session and writes outputs-FAMILY.npz
                                                    and manifest-FAMILY.json (into OUT, default: beside this file)
  python make_arm64_goldens.py check FAMILY OUT     (any host) compares OUT's outputs with the recorded ones
Every case of ../onnxruntime-avx2 (models and inputs are reused, not copied) and of cases/ is replayed; whole
nets (case names starting with ``net``) run record by record (batch 1), as the x86 goldens were made.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
AVX2 = HERE.parent / "onnxruntime-avx2"
CASES = HERE / "cases"
MS = "com.microsoft"


def _case_dirs() -> list[tuple[str, Path]]:
    """(case name, folder) of every replayed case: the x86 goldens' models, then the ARM-only ones."""
    avx2 = json.loads((AVX2 / "manifest.json").read_text())["cases"]
    found = [(case["case"], AVX2 / case["case"]) for case in avx2]
    if CASES.is_dir():
        found += [(folder.name, folder) for folder in sorted(CASES.iterdir()) if (folder / "model.onnx").is_file()]
    return found


def _cpu_features() -> list[str]:
    """The ``Features`` line of /proc/cpuinfo and the HWCAP bits of the process (what qemu's -cpu gives)."""
    hwcap = _hwcaps()
    return sorted(hwcap)


def _hwcaps() -> set[str]:
    """Named HWCAP/HWCAP2 bits from /proc/self/auxv (Linux aarch64 numbering)."""
    names = {
        ("hwcap", 1): "asimd",
        ("hwcap", 20): "asimddp",
        ("hwcap", 22): "sve",
        ("hwcap2", 13): "i8mm",
        ("hwcap2", 14): "bf16",
        ("hwcap2", 1): "sve2",
    }
    words = np.frombuffer(Path("/proc/self/auxv").read_bytes(), dtype=np.uint64).reshape(-1, 2)
    values = {"hwcap": 0, "hwcap2": 0}
    for key, value in words:
        if key == 16:
            values["hwcap"] = int(value)
        elif key == 26:
            values["hwcap2"] = int(value)
    return {name for (word, bit), name in names.items() if values[word] >> bit & 1}


def check(family: str, out: Path) -> int:
    """Values of ``out``'s outputs that differ from the recorded ones (every case must be there)."""
    with np.load(HERE / f"outputs-{family}.npz") as want, np.load(out / f"outputs-{family}.npz") as got:
        manifest = json.loads((out / f"manifest-{family}.json").read_text())
        skipped = set(manifest.get("not_implemented", []))
        expected = sorted(k for k in want.files if k.split("/")[0] not in skipped)
        if expected != sorted(got.files):
            sys.exit(f"{out}: the cases differ from the recorded goldens of {family}")
        if skipped:
            print(f"{family}: {len(skipped)} cases not implemented by onnxruntime {manifest['onnxruntime']}")
        bad = {k: int(np.count_nonzero(want[k] != got[k])) for k in expected}
    for key, count in bad.items():
        if count:
            print(f"{family}: {key}: {count} values differ from the recorded goldens")
    return sum(bad.values())


def record(family: str, out: Path = HERE) -> None:
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    outputs: dict[str, np.ndarray] = {}
    listed, skipped = [], []
    for name, folder in _case_dirs():
        try:
            session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # an older release without the kernel (1.18: ConvInteger with int8)
            if "NOT_IMPLEMENTED" not in str(error):
                raise
            skipped.append(name)
            continue
        feeds = dict(np.load(folder / "inputs.npz"))
        names = [o.name for o in session.get_outputs()]
        if name.startswith("net"):
            records = next(iter(feeds.values())).shape[0]
            runs = [session.run(None, {k: v[i : i + 1] for k, v in feeds.items()}) for i in range(records)]
            got = [np.concatenate([run[j] for run in runs]) for j in range(len(names))]
        else:
            got = session.run(None, feeds)
        for output, value in zip(names, got, strict=True):
            outputs[f"{name}/{output}"] = value
        listed.append({"case": name, "folder": str(folder.relative_to(HERE.parent)), "outputs": names})
        print(name, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / f"outputs-{family}.tmp.npz", **outputs)
    Path(out / f"outputs-{family}.tmp.npz").replace(out / f"outputs-{family}.npz")
    meta = {
        "family": family,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpu_features": _cpu_features(),
        "session": {
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "intra_op_num_threads": 1,
            "session_config": {},
            "providers": ["CPUExecutionProvider"],
        },
        "cases": listed,
        "not_implemented": skipped,
    }
    (out / f"manifest-{family}.tmp.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / f"manifest-{family}.tmp.json").replace(out / f"manifest-{family}.json")
    print(len(listed), "cases", family, meta["cpu_features"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(sys.argv[2], Path(sys.argv[3]) if len(sys.argv) > 3 else HERE)
    elif sys.argv[1:2] == ["check"]:
        sys.exit(1 if check(sys.argv[2], Path(sys.argv[3])) else 0)
    elif sys.argv[1:2] == ["cases"]:
        from _arm64_cases import write_cases

        write_cases(CASES)
    else:
        sys.exit(__doc__)
