"""``qaccuracy report DIR``: (re)build ``DIR/report.html`` from the comparison JSON files under DIR.

A comparison JSON (contract 2) is any ``*.json`` file, searched recursively, whose top-level object
has ``schema_version`` and ``layers``; other JSON files (visq.json, baselines, mappings) are skipped.
The same comparison found twice (``--json`` and ``--out-dir`` copies) is shown once.
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="folder holding comparison JSON files (contract 2)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: DIR/report.html)")
    parser.add_argument("--title", default=None, help="page title (default: 'Quantization accuracy report')")


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
    from pytest_qaccuracy.report.atomic import check_file_target
    from pytest_qaccuracy.report.html import DEFAULT_TITLE, write_html

    out = args.out if args.out is not None else args.dir / "report.html"
    if args.dir.is_dir():
        check_file_target(out, "--out")
    found = load_comparisons(args.dir)
    path = write_html(out, [result for _, result in found], title=args.title or DEFAULT_TITLE)
    for source, _ in found:
        sys.stdout.write(f"read {source}\n")
    sys.stdout.write(f"wrote {path} ({len(found)} comparison{'s' if len(found) != 1 else ''})\n")
    return 0
