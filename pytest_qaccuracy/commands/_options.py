"""Options shared by the sub-commands: one name, one default and one meaning for each.

``--data``, ``--metrics``, ``--batch-size``, ``--threads``, ``--providers``, ``--top``, ``--json``,
``--out-dir``, ``--exclude-nodes`` read the same wherever a command has them. Files: ``--json FILE`` is
the command's result as JSON, ``--out-dir DIR`` a folder of artifacts, ``--out FILE`` the one file the
command exists to produce (``run``: HDF5, ``calibrate``: a model, ``report``: HTML). One spelling
per option: no aliases, and no abbreviations (the parsers set ``allow_abbrev=False``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pytest_qaccuracy import defaults
from pytest_qaccuracy.errors import InputError

DEFAULT_PROVIDERS = "CPUExecutionProvider"


class HelpFormatter(argparse.HelpFormatter):
    """Shows ``(default: X)`` after every option that has a default, unless its help already says."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == argparse.SUPPRESS or default in ([], "")
        if unset or "default" in text or not action.option_strings:
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else "%(default)s"
        return f"{text} (default: {shown})"


def names(text: str) -> tuple[str, ...]:
    """``a, b,c`` -> ``("a", "b", "c")``."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def add_data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, type=Path, help=".h5/.hdf5 (ONE layout), .npz, or a folder of .npy (docs/data.md)"
    )


def add_batch_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=defaults.BATCH_SIZE, metavar="N", help="records per run")


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="intra-op threads of onnxruntime and of the integer backend alike; 0: every core",
    )


def add_providers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--providers",
        default=DEFAULT_PROVIDERS,
        metavar="LIST",
        help="comma-separated onnxruntime execution providers; one that onnxruntime lacks here is an error",
    )


def add_top(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--top", type=int, default=defaults.TOP, metavar="N", help=f"how many {what} to print")


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help=f"write {what} as JSON to FILE")


def add_out_dir(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--out-dir", type=Path, default=None, metavar="DIR", help=f"write {what} to DIR")


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help=(
            "no progress on stderr (redrawn on a terminal, a plain line every 30 s of a long job in a log; "
            "QACCURACY_PROGRESS=0 or 1 decides otherwise)"
        ),
    )


def check_counts(args: argparse.Namespace) -> None:
    """The shared counts are in range; InputError (exit 2) naming the option otherwise."""
    for flag, minimum in (("batch_size", 1), ("threads", 0), ("top", 0)):
        value = getattr(args, flag, None)
        if value is not None and value < minimum:
            raise InputError(f"--{flag.replace('_', '-')} must be >= {minimum}, got {value}")


def providers(args: argparse.Namespace) -> tuple[str, ...]:
    """``--providers`` as a tuple; a provider onnxruntime lacks is an error, as in the plugin
    (onnxruntime would silently run on the CPU instead)."""
    import onnxruntime

    wanted = names(args.providers)
    available = onnxruntime.get_available_providers()
    missing = [p for p in wanted if p not in available]
    if missing:
        raise InputError(f"--providers: {', '.join(missing)} not available (available: {', '.join(available)})")
    if not wanted:
        raise InputError("--providers: give at least one execution provider")
    return wanted


def runtime_options(args: argparse.Namespace, **extra: Any) -> Any:
    """:class:`~pytest_qaccuracy.runtime.RuntimeOptions` from the shared options, checked."""
    from pytest_qaccuracy.runtime import RuntimeOptions

    check_counts(args)
    return RuntimeOptions(providers=providers(args), threads=args.threads, batch_size=args.batch_size, **extra)


def task_spec(text: str) -> object:
    """``--task-metric``: a path or name as it is, a JSON table ``{"metric": ..., <options>}`` parsed."""
    import json

    if not text.lstrip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--task-metric {text!r}: not a JSON table ({exc.msg})") from None
