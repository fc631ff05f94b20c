"""glibc's heap kept warm for the backend's numpy temporaries.

The kernels allocate temporaries of 0.1-30 MB on every chunk. glibc serves such blocks from the heap
once its dynamic mmap threshold has risen past them, and gives the heap's freed top back to the
system when it grows past the trim threshold; which of the two a process settles into depends on
its allocation history. In some processes every run then faults its temporaries' pages in afresh:
the plain bench net took 55-61 ms of CPU per run there against 47-50 ms in others (4,600 page faults
a run against a handful), the same code; the exact path 41 against 37 ms.

:func:`keep_temporaries_warm` fixes the mmap threshold at glibc's own ceiling for it (32 MB) and keeps
up to 64 MB of freed memory at the heap's top, once per process, but only when asked: the settings
are the whole process's, so a library leaves them alone unless ``QACCURACY_HEAP=tuned``. Elsewhere
than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

from pytest_qaccuracy.errors import InputError

#: environment variable: ``tuned`` sets glibc's parameters below; ``system`` (the default) leaves them
ENV = "QACCURACY_HEAP"
#: its values
TUNED, SYSTEM = "tuned", "system"
#: ``mallopt`` parameters (glibc's malloc.h)
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: blocks below this come from the heap: the ceiling glibc's dynamic threshold rises to on 64-bit
MMAP_THRESHOLD = 32 << 20
#: freed memory kept at the heap's top rather than returned to the system
TOP_PAD = 64 << 20

_lock = threading.Lock()
_applied: bool | None = None


def _mallopt():
    """glibc's ``mallopt``, or None elsewhere (musl, macOS, Windows)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def keep_temporaries_warm() -> bool:
    """With ``QACCURACY_HEAP=tuned``, set glibc's mmap threshold and top pad, once per process; whether set.

    Process-wide: every later allocation of this process below 32 MB comes from the heap, and up to
    64 MB of freed memory stays mapped for the next one. Without the opt-in, nothing changes.
    """
    global _applied
    value = os.environ.get(ENV, "").strip().lower() or SYSTEM
    if value not in (TUNED, SYSTEM):
        raise InputError(f"{ENV}={os.environ[ENV]!r}: expected {TUNED!r} or {SYSTEM!r}")
    with _lock:
        if _applied is None:
            _applied = False
            if value == TUNED:
                mallopt = _mallopt()
                if mallopt is not None:
                    # both: setting one turns glibc's dynamic threshold off, which alone made it worse
                    # (every block above 128 KB mapped afresh: 59,000 faults a run on the mobile net)
                    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TOP_PAD, TOP_PAD))
        return _applied
