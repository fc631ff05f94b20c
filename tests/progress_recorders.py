"""Stand-ins that write down what a call reports or closes: progress recorders, a dataset-close spy;
and a clock moved by hand."""

from __future__ import annotations

from pytest_qaccuracy.data.progress import ProgressLine


class TaskRecorder(ProgressLine):
    """A progress line that records each task it is told about: ``[label, total, records advanced]``."""

    def __init__(self) -> None:
        super().__init__(stream=None)  # type: ignore[arg-type]
        self.tasks: list[list] = []

    def start(self, label: str, total: int) -> None:
        self.tasks.append([label, total, 0])

    def advance(self, records: int) -> None:
        self.tasks[-1][2] += records

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class CallRecorder:
    """A progress that records every call, in order: ``("start", (label, total))``, ``("advance", n)``,
    ``("finish", None)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start(self, label: str, total: int) -> None:
        self.calls.append(("start", (label, total)))

    def advance(self, records: int) -> None:
        self.calls.append(("advance", records))

    def finish(self) -> None:
        self.calls.append(("finish", None))

    def close(self) -> None:
        pass


def record_closes(monkeypatch, module) -> list:
    """Wrap ``module.load_dataset`` so each dataset it opens appends its path to the returned list when
    closed: a test of "the datasets a call opened are closed, the caller's are not"."""
    closed: list = []
    real = module.load_dataset

    def opened(path):
        found = real(path)
        close = found.close
        found.close = lambda: (closed.append(path), close())
        return found

    monkeypatch.setattr(module, "load_dataset", opened)
    return closed


class Clock:
    """``time.monotonic``'s stand-in, moved on by hand (``now``), from 0 so that sums stay exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now
