"""Which library statements no test executes: the whole suite and the real-model corpus under coverage.py.

Runs ``pytest -n 2 tests`` and then ``pytest -n 2 -m corpus tests/corpus`` with every Python process
they start measured (pytest-xdist's workers and the pytester subprocesses too: a ``sitecustomize``
on ``PYTHONPATH`` starts coverage in each), combines the data and prints the statements not run, per
file. A statement no test reaches is an error path whose message nobody has read, or dead code.

    python scripts/line_coverage.py                 # suite and corpus (about 20 minutes on 2 cores)
    python scripts/line_coverage.py --no-corpus     # the suite alone
    python scripts/line_coverage.py --keep DIR      # keep the combined data file in DIR

Needs coverage.py (a dependency of the ``mutation`` extra) and, for the corpus, ``.[corpus]`` and
``python scripts/build_corpus.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTUP = "import coverage\ncoverage.process_startup()\n"


def rcfile(data: Path) -> str:
    """coverage.py's settings: every process writes its own file under ``data``, the library only."""
    return f"[run]\nparallel = True\ndata_file = {data / '.coverage'}\nsource = pytest_qaccuracy\n"


def run_measured(args: list[str], work: Path) -> int:
    """``python -m pytest ARGS`` in the project with every process it starts under coverage."""
    env = dict(os.environ)
    env["COVERAGE_PROCESS_START"] = str(work / "coveragerc")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work / "startup"), str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    print("$", " ".join(command), flush=True)
    return subprocess.call(command, cwd=ROOT, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-corpus", action="store_true", help="the suite alone, not the corpus tests")
    parser.add_argument("--jobs", default="2", help="pytest-xdist workers (default 2)")
    parser.add_argument("--keep", type=Path, help="copy the combined .coverage data file into this folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qaccuracy-coverage-") as tmp:
        work = Path(tmp)
        (work / "startup").mkdir()
        (work / "startup" / "sitecustomize.py").write_text(STARTUP, encoding="utf-8")
        data = work / "data"
        data.mkdir()
        (work / "coveragerc").write_text(rcfile(data), encoding="utf-8")
        runs = [["-n", args.jobs, "tests"]]
        if not args.no_corpus:
            runs.append(["-n", args.jobs, "-m", "corpus", "tests/corpus"])
        failed = [run for run in runs if run_measured(run, work) != 0]
        settings = ["--rcfile", str(work / "coveragerc")]
        subprocess.check_call([sys.executable, "-m", "coverage", "combine", "-q", *settings, str(data)], cwd=ROOT)
        report = [sys.executable, "-m", "coverage", "report", "-m", "--skip-covered", *settings]
        subprocess.check_call([*report, "--data-file", str(data / ".coverage")], cwd=ROOT)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(data / ".coverage", args.keep / ".coverage")
    if failed:
        print(f"tests failed in: {', '.join(' '.join(run) for run in failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
