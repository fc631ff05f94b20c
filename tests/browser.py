"""Headless Chromium for the report tests: find it, load a page, read its DOM, console and screenshots.

Imported as ``browser`` (tests/conftest.py puts this folder on ``sys.path``). Tests that need it
take the ``chromium`` fixture of their conftest, which skips when no Chromium is installed.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
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


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    commands on the child's fd 3, answers on its fd 4; JSON messages ending in NUL). Sets the
    viewport exactly (``--window-size`` cannot go below 500 px wide in headless mode), runs
    scripts in the page and takes screenshots. Use as a context manager."""

    def __init__(self, chromium: str, profile: Path) -> None:
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        # the child's ends above 9, so that moving them to 3 and 4 overwrites neither of them
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
        os.close(to_child)
        os.close(from_child)
        to_child, from_child = moved
        self.log = profile / "chromium-devtools.log"
        command = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile / 'chromium-devtools'}",
        ]

        # a Python trampoline puts the pipe ends on fds 3 and 4 and becomes Chromium (no preexec
        # hook: xdist workers run threads; dash cannot redirect fds above 9)
        trampoline = "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
        trampoline += "os.execv(sys.argv[3], sys.argv[3:])"
        wired = [sys.executable, "-c", trampoline, str(to_child), str(from_child), *command]
        self.proc = subprocess.Popen(
            wired,
            pass_fds=(to_child, from_child),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
        )
        os.close(to_child)
        os.close(from_child)
        self._buffer, self._next, self.session = b"", 0, None
        self.console: list[str] = []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")

    def __enter__(self) -> DevTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.session = None
                self.send("Browser.close")
            except (OSError, AssertionError):
                self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _message(self) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_child], [], [], 60)
            assert ready, "Chromium did not answer within 60 s"
            chunk = os.read(self._from_child, 1 << 20)
            assert chunk, f"Chromium closed its DevTools pipe: {self.log.read_text(errors='replace')[-2000:]}"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _note(self, message: dict) -> None:
        if message.get("method") == "Runtime.consoleAPICalled":
            args = message["params"].get("args", [])
            self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
        elif message.get("method") == "Runtime.exceptionThrown":
            self.console.append(str(message["params"]["exceptionDetails"].get("exception", {}).get("description")))

    def send(self, method: str, **params: object) -> dict:
        """Send a command and wait for its answer (events meanwhile are noted or dropped)."""
        import json

        self._next += 1
        message: dict = {"id": self._next, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._message()
            if answer.get("id") == self._next:
                assert "error" not in answer, (method, answer["error"])
                return answer.get("result", {})
            self._note(answer)

    def wait_for(self, event: str) -> dict:
        while True:
            message = self._message()
            self._note(message)
            if message.get("method") == event:
                return message.get("params", {})

    def open(self, url: str, width: int, height: int) -> None:
        """Load ``url`` in a ``width`` x ``height`` viewport and wait for its load event."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def run(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (promises awaited)."""
        found = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in found, found["exceptionDetails"]
        return found["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        """Save the viewport as a PNG at ``path``; returns the PNG (:func:`png_rgb` reads it)."""
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data
