"""torch's logging during capture, kept instead of printed: a failed data-dependent guard makes torch print the
partial FX graph to stderr (twice, ``print(e.partial_fx_graph, file=sys.stderr)`` in torch/export/_trace.py) and
log warnings, which bury the one line a user needs. ``kept()`` gives every torch logger that has handlers one
recording handler and sends sys.stderr to a buffer for the duration of the call; on exit it puts the original
handlers and stream back (nothing outlives the call) and replays what was written to stderr, less the texts
the caller withheld (the graph dumps): the model's own stderr output still reaches the user. The kept text goes
into the error (and ``--dump``)."""

from __future__ import annotations

import contextlib
import io
import logging
import sys


class _Keep(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(f"[{record.levelname} {record.name}] {record.getMessage()}")
        except Exception:  # noqa: BLE001 - a record that cannot format is dropped, never raised into capture
            pass


def _torch_loggers() -> list[logging.Logger]:
    loggers = [logging.getLogger("torch")]
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch.") and isinstance(lg, logging.Logger):
            loggers.append(lg)
    return [lg for lg in loggers if any(_to_console(h) for h in lg.handlers)]


def _to_console(handler: logging.Handler) -> bool:
    """A plain StreamHandler, as torch puts on its loggers for the console; file handlers and TORCH_TRACE's
    LazyTraceHandler (subclasses) keep working untouched."""
    return type(handler) is logging.StreamHandler


class Kept:
    """What torch logged (``lines``) and the stderr texts not to replay (``withhold``)."""

    def __init__(self, lines: list[str] | None = None):
        self.lines: list[str] = [] if lines is None else lines
        self.withheld: list[str] = []

    def withhold(self, error: BaseException) -> None:
        """Keep the graph torch prints for ``error`` (its ``partial_fx_graph``) off stderr."""
        graph = getattr(error, "partial_fx_graph", None)
        if isinstance(graph, str) and graph.strip():
            self.withheld.append(graph)


@contextlib.contextmanager
def kept(into: list[str] | None = None):
    """Within the block torch's log records go to the yielded ``Kept`` (its ``lines``: ``into`` when given)
    instead of their handlers (stderr), and sys.stderr is buffered; on exit every logger has its own handlers
    again and sys.stderr is the stream it was, whatever the block raised, and the buffered stderr text is
    written there without the withheld graphs."""
    keep = Kept(into)
    handler = _Keep(keep.lines)
    saved = [(lg, list(lg.handlers)) for lg in _torch_loggers()]
    buffer = io.StringIO()
    try:
        for lg, handlers in saved:
            lg.handlers = [handler] + [h for h in handlers if not _to_console(h)]
        with contextlib.redirect_stderr(buffer):
            yield keep
    finally:
        for lg, handlers in saved:
            lg.handlers = handlers
        text = buffer.getvalue()
        for graph in keep.withheld:
            if graph in text:
                keep.lines.append(graph)
                text = text.replace(graph + "\n", "").replace(graph, "")
        if text:
            sys.stderr.write(text)
