"""What a running export reports while it works (the stage running, counts such as "cubins 37/112"), passed as a
value through the pipeline to whoever shows it: ``Progress`` ignores everything (library calls, ``--quiet``,
``--json``, stderr not a terminal), ``TerminalProgress`` keeps one live line on a terminal with the elapsed time.
Stages report; they never print."""

from __future__ import annotations

import threading
import time
from typing import TextIO


class Progress:
    """The reporter every stage receives; this one discards everything."""

    def stage(self, name: str, detail: str = "") -> None:
        """A stage starts; ``detail`` says what it does ("building 3 CPU bundles")."""

    def step(self, done: int, total: int, what: str) -> None:
        """``done`` of ``total`` ``what`` (e.g. cubins) are finished within the running stage."""

    def stage_done(self, name: str, seconds: float) -> None:
        """A stage finished after ``seconds``."""

    def close(self) -> None:
        """The export is over (finished or failed): leave the terminal clean."""


class StageLog(Progress):
    """One line per finished stage (``  capture    1.23 s``) on ``stream``: what a log file or CI output keeps."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def stage_done(self, name: str, seconds: float) -> None:
        print(f"  {name:<14} {seconds:7.2f} s", file=self.stream, flush=True)


class TerminalProgress(StageLog):
    """A live status line on a terminal, ``[  12.3 s] build_cuda: cubins 37/112``, redrawn every ``interval``
    seconds by a daemon thread (so the clock moves during a long stage), and the finished stages' lines above it."""

    def __init__(self, stream: TextIO, interval: float = 0.2, clock=time.monotonic):
        super().__init__(stream)
        self.clock, self.t0, self.interval = clock, clock(), interval
        self.text = "starting"
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.width = 0
        self.thread = threading.Thread(target=self._tick, name="tcexport-progress", daemon=True)
        self.thread.start()

    def stage(self, name: str, detail: str = "") -> None:
        self._set(f"{name}: {detail}" if detail else name)

    def step(self, done: int, total: int, what: str) -> None:
        with self.lock:
            head = self.text.split(": ", 1)[0]
        self._set(f"{head}: {what} {done}/{total}")

    def stage_done(self, name: str, seconds: float) -> None:
        with self.lock:
            self._clear()
            super().stage_done(name, seconds)
            self._draw()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        with self.lock:
            self._clear()

    def _set(self, text: str) -> None:
        with self.lock:
            self.text = text
            self._draw()

    def _tick(self) -> None:
        while not self.stopped.wait(self.interval):
            with self.lock:
                self._draw()

    def _draw(self) -> None:
        line = f"[{self.clock() - self.t0:6.1f} s] {self.text}"
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def _clear(self) -> None:
        self.stream.write("\r" + " " * self.width + "\r")
        self.stream.flush()
        self.width = 0


def for_stream(stream: TextIO, quiet: bool) -> Progress:
    """The reporter a command line uses: nothing when ``quiet``, a live line on a terminal, stage lines otherwise."""
    if quiet:
        return Progress()
    isatty = getattr(stream, "isatty", None)
    return TerminalProgress(stream) if isatty is not None and isatty() else StageLog(stream)
