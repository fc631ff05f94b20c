"""What the report's *Environment* section shows: when and where the numbers were made.

pytest-html users expect it: versions, the CPU (which also decides onnxruntime's int8 results:
docs/cpus.md), the date and the commit. Each row is ``[name, text]``; a value that cannot be found
is left out rather than guessed.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

#: CI systems' variables holding the commit being built, first found wins.
COMMIT_VARIABLES = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILD_SOURCEVERSION", "GIT_COMMIT", "BUILDKITE_COMMIT")


def cpu_name() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what :mod:`platform` says) and its
    logical core count."""
    name = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            name = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), None)
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or None
    cores = os.cpu_count()
    return f"{name}, {cores} logical cores" if name and cores else name


def commit(root: Path | None = None) -> str | None:
    """The commit: a CI variable (:data:`COMMIT_VARIABLES`), else ``git rev-parse HEAD`` in ``root``
    (None without git or outside a repository)."""
    for variable in COMMIT_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root or Path.cwd(),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _host_family() -> str | None:
    try:
        from pytest_qaccuracy.backend.host import host_preset

        return host_preset()
    except Exception:  # the section must not stop a report: onnxruntime's probe failing leaves the row out
        return None


def environment(root: Path | None = None, created: datetime | None = None) -> list[list[str]]:
    """The rows of the Environment section: date (UTC), commit, versions, platform, CPU, and the
    onnxruntime int8 arithmetic family of this machine."""
    from pytest_qaccuracy.report.summary import versions

    when = (created or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    rows: list[list[str | None]] = [["created (UTC)", when], ["commit", commit(root)]]
    rows += [[name, version] for name, version in versions().items()]
    rows += [
        ["platform", platform.platform()],
        ["CPU", cpu_name()],
        ["onnxruntime int8 family", _host_family()],
    ]
    return [[name, value] for name, value in rows if value]
