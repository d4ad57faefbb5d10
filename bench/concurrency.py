"""The concurrency row: how a loaded model serves several callers at once.

A server calls one loaded model from several request threads. Each of N threads calls the same callable in a loop
for a fixed time; the figure is calls per second over all threads. A backend whose per-call thread team spins or
forks and joins per kernel loses here even when its single-call latency wins, which is what this row shows.
"""

from __future__ import annotations

import threading
import time

import torch

BACKENDS = ("tcpkg", "onnxruntime", "openvino")  # the backends the row compares (those a server runs torch-free)


def throughput(fn, xs: tuple, callers: tuple, seconds: float) -> dict:
    """{callers: {"calls_per_s", "calls", "seconds"}} for each caller count; ``fn`` is already warm."""
    out = {}
    for n in callers:
        counts = [0] * n
        errors: list = []
        start = threading.Barrier(n + 1)
        stop_at = [0.0]

        def work(k: int) -> None:
            start.wait()
            try:
                with torch.no_grad():  # grad mode is per thread
                    while time.perf_counter() < stop_at[0]:
                        fn(*xs)
                        counts[k] += 1
            except Exception as e:  # reported as the row's error: a backend that is not thread-safe fails here
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(n)]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        stop_at[0] = t0 + seconds
        start.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"{n} concurrent callers: {errors[0]}")
        out[n] = {"calls_per_s": sum(counts) / elapsed, "calls": sum(counts), "seconds": elapsed}
    return out
