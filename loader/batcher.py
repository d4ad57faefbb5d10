"""Dynamic batching for a loaded package, with or without a server: concurrent requests merged along the batch
symbol.

Many callers (a server's request handlers, threads, asyncio tasks) each bring a few rows; one call over their rows
concatenated costs far less than as many calls (the weights are read once, the threads wake once). A Batcher owns
one runner thread per model, the only thread that calls it, so the model's own thread pool has the cores to itself
however many callers wait. The runner takes the first waiting request, waits up to ``max_delay_ms`` for more (or
until the batch limit's rows are there; by default it does not wait, as Triton's dynamic batcher by default does not: the
requests that queue while a call runs form the next batch), and hands them to ``RequestRunner`` (request_runner.py): each request
checked alone first, the good ones merged by ``merge_key`` up to the limit, run once and split back, a failure kept
to the request that caused it. While a call runs, new requests queue up and form the next batch, so under load the
batches grow by themselves and with one caller nothing waits longer than the delay.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from tcexport.formats.errors import ArityError, TcError
from tcexport.formats.state import first_names

from .arrays import convert_inputs, convert_outputs
from .request_runner import Outcome, RequestRunner


class BatcherClosedError(TcError):
    """A request reached a Batcher after ``close()``: the model is being unloaded (retry on its successor)."""

    exit_code = 3


@dataclass
class _Request:
    arrays: list
    as_torch: bool
    future: Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class BatchRecord:
    """One executed call, as ``on_batch`` receives it: its rows, how many requests the batch it belongs to held,
    their time queued (seconds, one per request, on the batch's first call only) and the call's own seconds."""

    rows: int
    requests: int
    queued: tuple
    seconds: float


_STOP = object()


class Batcher:
    """``Batcher(model, max_batch=None, max_delay_ms=0)``; call it like the model (blocking), ``submit`` for a
    ``concurrent.futures.Future``, ``await infer(...)`` from asyncio. ``on_batch(BatchRecord)`` sees every call
    made (for metrics). ``close()`` finishes what is queued, then stops the runner."""

    def __init__(self, model, max_batch: int | None = None, max_delay_ms: float = 0.0, on_batch=None):
        if isinstance(max_delay_ms, bool) or not isinstance(max_delay_ms, (int, float)) or max_delay_ms < 0:
            raise TcError(f"max_delay_ms should be a number >= 0, got {max_delay_ms!r}")
        if model.manifest.state:
            names = first_names((s.name for s in model.manifest.state), most=4)
            raise TcError(f"model {model.manifest.model!r} has state ({names}): each call continues the one before "
                          "it, so requests cannot be batched or served from one shared model. Call it per "
                          "conversation through model.new_session() (examples/generate.py).")
        self.model = model
        self._calls: list[tuple[int, float]] = []  # (rows, seconds) of the calls of the batch running now
        self.runner = RequestRunner(model, max_batch, on_call=lambda rows, s: self._calls.append((rows, s)))
        self.max_delay = max_delay_ms / 1000.0
        self.on_batch = on_batch
        self._names = tuple(s.name for s in model.manifest.inputs)
        self._single = model.manifest.output_structure == "single"
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"tcexport-batcher-{model.manifest.model}",
                                        daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Requests submitted and not yet answered (the queue depth a server reports)."""
        return self._pending

    def submit(self, *args, **kwargs) -> Future:
        """Queue one request (inputs positionally in manifest order, or by name); its Future holds the outputs
        (one array, or a tuple, as the model returns them) or the typed error that request alone caused."""
        arrays, as_torch = convert_inputs(self._gather(args, kwargs), self._names)
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise BatcherClosedError(f"the batcher of model {self.model.manifest.model!r} is closed; "
                                         "send the request to the model that replaced it")
            self._pending += 1
            self._queue.put(_Request(arrays, as_torch, fut))
        return fut

    def __call__(self, *args, **kwargs):
        return self.submit(*args, **kwargs).result()

    async def infer(self, *args, **kwargs):
        return await asyncio.wrap_future(self.submit(*args, **kwargs))

    def close(self, timeout: float | None = None) -> None:
        """Answer every queued request, then stop the runner thread (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _gather(self, args, kwargs) -> list:
        names = self._names
        if not kwargs and len(args) == len(names):
            return list(args)
        values = dict(zip(names, args))
        unknown = [k for k in kwargs if k not in names]
        if len(args) > len(names) or unknown:
            raise ArityError(f"model {self.model.manifest.model!r} takes input(s) {', '.join(names)}; got "
                             f"{len(args)} positional and {sorted(kwargs)} by name", expected=list(names),
                             got=len(args) if not unknown else unknown[0], rule="arity")
        values.update(kwargs)
        missing = [n for n in names if n not in values]
        if missing:
            raise ArityError(f"model {self.model.manifest.model!r} is missing input(s) {', '.join(missing)}",
                             input=missing[0], expected=list(names), got=sorted(values), rule="arity")
        return [values[n] for n in names]

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                break
            batch, stop = self._collect(first)
            self._execute(batch)

    def _collect(self, first: _Request) -> tuple[list, bool]:
        """The first request and those that arrive within the delay, until the batch limit's rows are there."""
        batch, total = [first], _rows(first)
        limit = self.runner.limit if self.runner.axis is not None else 1
        deadline = time.perf_counter() + self.max_delay
        while limit is None or total < limit:
            wait = deadline - time.perf_counter()
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
            total += _rows(item)
        return batch, False

    def _execute(self, batch: list[_Request]) -> None:
        started = time.perf_counter()
        self._calls.clear()
        try:
            outcomes = self.runner.run([r.arrays for r in batch])
        except BaseException as e:  # noqa: BLE001 - a bug below must fail these requests, never hang them
            outcomes = [Outcome(error=e) for _ in batch]
        for request, outcome in zip(batch, outcomes):
            with self._lock:
                self._pending -= 1
            if outcome.error is not None:
                request.future.set_exception(outcome.error)
            else:
                outputs = convert_outputs(outcome.outputs, request.as_torch)
                request.future.set_result(outputs[0] if self._single else tuple(outputs))
        if self.on_batch is not None:
            queued = tuple(started - r.queued_at for r in batch)
            for k, (rows, seconds) in enumerate(list(self._calls)):  # queue times once per request
                self.on_batch(BatchRecord(rows, len(batch), queued if k == 0 else (), seconds))


def _rows(request: _Request) -> int:
    a = request.arrays[0] if request.arrays else None
    return int(a.shape[0]) if isinstance(a, np.ndarray) and a.ndim else 1
