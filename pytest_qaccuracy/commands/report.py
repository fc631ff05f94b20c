"""``qaccuracy report DIR``: (re)build ``DIR/report.html`` from the comparison JSON files under DIR.

It never replaces a file it did not write (the pytest plugin's ``.qaccuracy/report.html``, say)
unless ``--force`` says so; the pages it writes end with :data:`WRITTEN_BY`.

A comparison JSON (:meth:`ComparisonResult.to_dict`) is any ``*.json`` file, searched recursively,
whose top-level object has ``schema_version`` and ``layers``; other JSON files (visq.json, baselines,
mappings) are skipped. The same comparison found twice (``--json`` and ``--out-dir`` copies) is shown once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.errors import InputError

NAME = "report"
HELP = "(re)build DIR/report.html from the comparison JSON files in DIR (searched recursively)"


#: Ends every page this command writes: a file without it (the pytest plugin's report, a page of
#: your own) is replaced only with ``--force``.
WRITTEN_BY = "<!-- written by qaccuracy report -->"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="folder holding comparison JSON files")
    parser.add_argument(
        "--out", type=Path, default=None, metavar="FILE", help="where to write the report (default: DIR/report.html)"
    )
    parser.add_argument("--title", default=None, help="page title (default: 'Quantization accuracy report')")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the output file even if this command did not write it (e.g. the plugin's .qaccuracy/report.html)",
    )


def check_replaceable(path: Path, force: bool) -> None:
    """Refuse to replace a file this command did not write, unless ``force``.

    Raises:
        InputError: ``path`` exists and does not end with :data:`WRITTEN_BY`.
    """
    if force or not path.is_file():
        return
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - 256))
            tail = handle.read().decode("utf-8", "replace")
    except OSError as exc:
        raise InputError(f"--out {path}: cannot be read ({exc.strerror or exc})") from None
    if WRITTEN_BY not in tail:
        raise InputError(
            f"--out {path}: exists and was not written by qaccuracy report; "
            "pass --force to replace it, or --out to write elsewhere"
        )


def find_json_files(root: Path) -> list[Path]:
    """Every ``*.json`` file under ``root``, sorted, without following symlinked folders."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        found.extend(Path(folder, name) for name in sorted(files) if name.endswith(".json"))
    return found


def load_comparison(path: Path) -> ComparisonResult | None:
    """The comparison in ``path``, or None when the file is JSON of another kind.

    Raises:
        InputError: the file cannot be read, is not valid JSON, or is a broken comparison.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise InputError(f"{path}: malformed JSON ({exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data or "layers" not in data:
        return None
    try:
        return ComparisonResult.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InputError(f"{path}: not a valid comparison JSON ({detail})") from None


def load_comparisons(root: Path) -> list[tuple[Path, ComparisonResult]]:
    """The distinct comparisons under ``root`` with the file each came from.

    Raises:
        InputError: ``root`` is not a folder, holds no comparison, or holds a bad JSON file.
    """
    if not root.is_dir():
        raise InputError(f"{root}: no such directory")
    seen: set[str] = set()
    found = []
    for path in find_json_files(root):
        result = load_comparison(path)
        if result is None:
            continue
        key = json.dumps(result.to_dict(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            found.append((path, result))
    if not found:
        raise InputError(f"{root}: no comparison JSON files found (files with 'schema_version' and 'layers')")
    return found


def run(args: argparse.Namespace) -> int:
    from pytest_qaccuracy.atomic import atomic_write_text, check_file_target, write_errors
    from pytest_qaccuracy.report.html import DEFAULT_TITLE, render_html

    out = args.out if args.out is not None else args.dir / "report.html"
    if args.dir.is_dir():
        check_file_target(out, "--out")
        check_replaceable(out, args.force)
    found = load_comparisons(args.dir)
    page = render_html([result for _, result in found], title=args.title or DEFAULT_TITLE)
    with write_errors("--out", out):
        path = atomic_write_text(out, f"{page.rstrip()}\n{WRITTEN_BY}\n")
    for source, _ in found:
        sys.stdout.write(f"read {source}\n")
    sys.stdout.write(f"wrote {path} ({len(found)} comparison{'s' if len(found) != 1 else ''})\n")
    return 0
