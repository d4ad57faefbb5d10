"""Run a list of requests handed over at once (by a serving engine, or by loader/batcher.py's queue), as few merged calls as is safe.

Triton's dynamic batcher calls a Python model's ``execute(requests)`` with the requests it gathered, and Ray
Serve's ``@serve.batch`` calls a method with a list; neither knows a package's guards. This module turns such a
list into calls of a loaded model: every request is checked alone first (so a bad one gets its own typed error
and never joins a batch), the good ones are grouped by ``loader.batching.merge_key``, concatenated up to the
batch limit, run once per group, and split back. A merged call that still fails (a kernel's runtime error, a
relation guard that the merged batch size breaks) is retried one request at a time, so the failure lands only on
the request that causes it. Synchronous and pure: the caller decides which thread runs it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tcexport.formats.errors import TcError
from tcexport.loader.batching import BatchAxis, batch_axis, concat, merge_key, rows, split
from tcexport.loader.guards import GuardPlan


@dataclass
class Outcome:
    """One request's result: its outputs in manifest order, or the error that request alone caused."""

    outputs: list[np.ndarray] | None = None
    error: Exception | None = None


class RequestRunner:
    """A loaded model with what merging needs (its guard plan and batch axis), computed once per model.

    ``max_batch`` caps the rows of one merged call below the batch symbol's own upper bound (None: the symbol's
    bound only). ``batches`` counts the calls actually made, by row count, for callers that report it;
    ``on_call(rows, seconds)`` is told of each call as it returns.
    """

    def __init__(self, model, max_batch: int | None = None, on_call=None):
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int)
                                      or max_batch < 1):
            raise TcError(f"max_batch should be None or an integer >= 1, got {max_batch!r}")
        self.model = model
        self.plan = GuardPlan(model.manifest)
        self.axis: BatchAxis | None = batch_axis(model.manifest)
        self.limit = self.axis.limit(max_batch) if self.axis is not None else 1
        self.batches: dict[int, int] = {}
        self.on_call = on_call
        self._count = threading.Lock()

    def run(self, requests: Sequence[Sequence[np.ndarray] | Exception]) -> list[Outcome]:
        """One Outcome per request, in order. A request given as an Exception (its inputs could not even be
        decoded) keeps that error; the others run."""
        outcomes = [Outcome(error=r) if isinstance(r, Exception) else None for r in requests]
        groups: dict[tuple, list[int]] = {}
        for i, arrays in enumerate(requests):
            if outcomes[i] is not None:
                continue
            try:
                self.plan.check(list(arrays))
            except Exception as e:  # noqa: BLE001 - a GuardError, or inputs that are not arrays at all
                outcomes[i] = Outcome(error=e)
                continue
            key = merge_key(arrays) if self.axis is not None else ("alone", i)
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            for chunk in self._chunks(members, requests):
                self._run_chunk(chunk, requests, outcomes)
        return outcomes

    def _chunks(self, members: list[int], requests) -> list[list[int]]:
        """Consecutive runs of a group whose rows add up to at most the limit (a request over it runs alone)."""
        if self.axis is None:
            return [[i] for i in members]
        chunks, current, total = [], [], 0
        for i in members:
            n = rows(requests[i])
            if current and (self.limit is not None and total + n > self.limit):
                chunks.append(current)
                current, total = [], 0
            current.append(i)
            total += n
        if current:
            chunks.append(current)
        return chunks

    def _run_chunk(self, chunk: list[int], requests, outcomes: list) -> None:
        if len(chunk) > 1:
            try:
                merged = self._call(concat([requests[i] for i in chunk]))
            except Exception:  # noqa: BLE001 - retried alone below, where the error is attributed
                merged = None
            if merged is not None:
                for i, outputs in zip(chunk, split(merged, [rows(requests[i]) for i in chunk])):
                    outcomes[i] = Outcome(outputs=outputs)
                return
        for i in chunk:
            try:
                outcomes[i] = Outcome(outputs=self._call(list(requests[i])))
            except Exception as e:  # noqa: BLE001 - one request's failure is its own response, never the server's
                outcomes[i] = Outcome(error=e)

    def _call(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        started = time.perf_counter()
        out = self.model(*arrays)
        outputs = list(out) if isinstance(out, tuple) else [out]
        n = rows(arrays) if self.axis is not None else 1
        with self._count:
            self.batches[n] = self.batches.get(n, 0) + 1
        if self.on_call is not None:
            self.on_call(n, time.perf_counter() - started)
        return outputs
