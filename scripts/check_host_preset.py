"""The ``onnxruntime`` preset against this machine's onnxruntime on every model of a built corpus.

For each model folder of the corpus (``scripts/build_corpus.py``) and each quantized variant in it, runs
the model record by record over its test split (``--records`` at most) on this machine's onnxruntime
(a default session; with ``--int8-allowed`` also one with ``session.qdqisint8allowed=1``, against the
preset that keeps int8 activations) and on the integer backend with the ``onnxruntime`` preset (the
probe's answer: this CPU's family), and counts the output values that differ. Needs no corpus extra (the models are
read as built), so it runs where only onnxruntime, onnx and numpy are installed, e.g. on an emulated
ARM64 CPU (``.ci/arm64`` with ``QACCURACY_CORPUS_DIR``)::

    python scripts/check_host_preset.py CORPUS_DIR [--records N] [--models a,b] [--int8-allowed]

Prints one line per model and variant; exits 1 when any value differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--records", type=int, default=4)
    parser.add_argument("--models", default="", help="comma-separated model names (default: every folder)")
    parser.add_argument(
        "--int8-allowed", action="store_true", help="also session.qdqisint8allowed=1 (what the agreement gate runs)"
    )
    args = parser.parse_args()

    from pytest_qaccuracy.backend import IntegerSession, get_scheme
    from pytest_qaccuracy.data import bind_dataset, load_dataset
    from pytest_qaccuracy.model.batch import stacking
    from pytest_qaccuracy.model.loading import graph_inputs, load_model
    from pytest_qaccuracy.ort_session import make_session

    scheme = get_scheme("onnxruntime")
    names = args.models.split(",") if args.models else sorted(p.name for p in args.corpus.iterdir() if p.is_dir())
    print(f"preset {scheme.name}", flush=True)
    failed = False
    for name in names:
        folder = args.corpus / name
        info = json.loads((folder / "model.json").read_text())
        for path in sorted(folder.glob("q*.onnx")):
            for session in ("default", "int8-allowed") if args.int8_allowed else ("default",):
                start = time.perf_counter()
                model, _ = stacking(load_model(str(path)))
                config = {"session.qdqisint8allowed": "1"} if session != "default" else {}
                preset = scheme.replace(name=scheme.name, qdq_int8_to_uint8=False) if config else scheme
                deployed = make_session(model, config=config)
                emulated = IntegerSession(model, preset)
                outputs = [o.name for o in deployed.get_outputs()]
                values = differing = 0
                dataset = load_dataset(folder / info["data"]["test"])
                try:
                    for index, batch in enumerate(bind_dataset(dataset, graph_inputs(model)).iter_batches(1)):
                        if index >= args.records:
                            break
                        feeds = batch.stacked()
                        for want, got in zip(deployed.run(outputs, feeds), emulated.run(outputs, feeds), strict=True):
                            values += np.asarray(want).size
                            differing += int(np.count_nonzero(np.asarray(want) != np.asarray(got)))
                finally:
                    dataset.close()
                failed |= differing > 0 or values == 0
                seconds = time.perf_counter() - start
                label = f"{name} {path.stem}" + (f" ({session} session)" if args.int8_allowed else "")
                print(f"{label}: {differing} of {values} output values differ ({seconds:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
