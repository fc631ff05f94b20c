"""The ``qaccuracy`` command: a thin layer over the library.

Each sub-command lives in ``pytest_qaccuracy/commands/<name>.py`` and exposes ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. Exit codes: 0 success, 1 a check
failed, 2 bad usage, bad input, or a model or tensor the command cannot handle, reported as a single
``error: ...`` line, 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pytest_qaccuracy.errors import QAccuracyError

#: Sub-command modules, in the order ``--help`` lists them.
COMMANDS = ("compare", "report", "sensitivity", "recipe", "run", "calibrate", "saturation")

#: Exit code of bad usage, bad input, or a model or tensor the command cannot handle (a check that fails
#: exits with 1, success with 0).
EXIT_USAGE = 2

#: Exit code of a command stopped by Ctrl-C (SIGINT), as a shell reports a process killed by it (128 + 2).
EXIT_INTERRUPTED = 130

EPILOG = """\
Options mean the same in every sub-command that has them: --data, --metrics, --batch-size,
--threads (0: every core), --providers, --top, --exclude-nodes. Files: --json FILE is the command's
result as JSON, --out-dir DIR a folder of artifacts, --out FILE the one file a command produces.
Exit codes: 0 success, 1 a check failed, 2 bad usage, bad input, or a model or tensor the command
cannot handle (one 'error:' line naming it), 130 interrupted (Ctrl-C)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {self.prog}: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-qaccuracy")
    except PackageNotFoundError:
        from pytest_qaccuracy import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    from pytest_qaccuracy.commands._options import HelpFormatter

    parser = _Parser(
        prog="qaccuracy",
        description="Quantization accuracy checks for ONNX model pairs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"qaccuracy (pytest-qaccuracy) {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"pytest_qaccuracy.commands.{name}")
        command = sub.add_parser(
            module.NAME, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter, allow_abbrev=False
        )
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (also used by the console script)."""
    from pytest_qaccuracy.report.terminal import escape_control

    try:  # Ctrl-C while the sub-commands import (numpy, onnxruntime) is an interrupt too
        from pytest_qaccuracy.data.progress import progress_for, reporting

        args = build_parser().parse_args(argv)
        with reporting(progress_for(sys.stderr, quiet=getattr(args, "quiet", False))):
            return int(args._run(args))
    except QAccuracyError as exc:  # bad input, or an op or tensor the checks cannot handle: one line
        sys.stderr.write(f"error: {escape_control(str(exc))}\n")
        return EXIT_USAGE
    except OSError as exc:  # a file the command reads or writes, which the command did not name itself
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"error: {escape_control(where + (exc.strerror or str(exc)))}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
