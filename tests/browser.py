"""Headless Chromium for the report tests: find it, load a page, read its DOM, console and screenshots.

Imported as ``browser`` (tests/conftest.py puts this folder on ``sys.path``). Tests that need it
take the ``chromium`` fixture of their conftest, which skips when no Chromium is installed.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: A console message as Chromium logs it with ``--enable-logging=stderr``.
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (.*)")


def find_chromium() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@dataclass(frozen=True)
class Page:
    """What Chromium printed: the DOM after the scripts ran (or nothing), and the console messages."""

    dom: str
    console: list[str]


def run_chromium(chromium: str, profile: Path, url: str, *extra: str) -> Page:
    """Load ``url`` in headless Chromium with ``extra`` arguments (``--dump-dom``, ``--screenshot=...``)."""
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile / 'chromium-profile'}",
        *extra,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return Page(done.stdout, [m[1] for line in done.stderr.splitlines() if (m := CONSOLE.search(line))])


def png_rgb(data: bytes) -> np.ndarray:
    """An 8-bit RGB(A), non-interlaced PNG (what Chromium writes) as a (height, width, 3) array; stdlib
    zlib plus numpy, so the tests need no imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], (0, 0, 0, 0, 0, 0, 0)
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data[pos + 8 : pos + 8 + length])
        elif kind == b"IDAT":
            idat.append(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, width * bpp + 1)
    out = np.zeros((height, width * bpp), np.int64)
    prev = np.zeros(width * bpp, np.int64)
    for y in range(height):  # undo each row's filter (PNG spec section 9)
        kind, cur = raw[y, 0], raw[y, 1:].astype(np.int64)
        if kind == 1:
            cur = np.cumsum(cur.reshape(width, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:
            cur = (cur + prev) & 255
        elif kind in (3, 4):
            for x in range(width * bpp):
                a = int(cur[x - bpp]) if x >= bpp else 0
                b = int(prev[x])
                if kind == 3:
                    cur[x] = (cur[x] + (a + b) // 2) & 255
                else:
                    c = int(prev[x - bpp]) if x >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y], prev = cur, cur
    return out.reshape(height, width, bpp)[:, :, :3].astype(np.uint8)


def painted(image: np.ndarray, colour: str) -> int:
    """How many pixels of ``image`` are exactly ``colour`` (``#rrggbb``)."""
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)
    return int((image.reshape(-1, 3) == rgb).all(axis=1).sum())
