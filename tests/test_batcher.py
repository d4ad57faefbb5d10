"""loader/batcher.py: concurrent requests merged along the batch symbol by one runner thread, a bad request
failing alone, asyncio and torch callers, packages without a batch axis, and close()."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import tcexport.loader as L
from tcexport.formats.errors import StaticDimError, SymbolRangeError
from tcexport.loader.batcher import BatcherClosedError
from tcexport.loader.batching import batch_axis
from packages import MODELS, built, mlp_package

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp():
    return L.load(mlp_package())


def _rows(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)


def test_concurrent_requests_merge_and_equal_direct_calls(mlp):
    records = []
    xs = [_rows(1 + k % 3, k) for k in range(48)]
    results = [None] * len(xs)
    with L.Batcher(mlp, max_delay_ms=20, on_batch=records.append) as batcher:
        def client(k):
            results[k] = batcher(xs[k])
        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for x, got in zip(xs, results):
        np.testing.assert_allclose(got, mlp(x), rtol=1e-5, atol=1e-6)
    assert sum(r.rows for r in records) == sum(len(x) for x in xs)
    assert max(r.rows for r in records) > 3  # requests were merged
    assert sum(len(r.queued) for r in records) == len(xs)  # each request's queueing counted once


def test_bad_request_fails_alone_and_limits_hold(mlp):
    with L.Batcher(mlp, max_batch=4, max_delay_ms=50) as batcher:
        good = [batcher.submit(_rows(2, k)) for k in range(4)]
        bad = batcher.submit(np.zeros((2, 63), np.float32))
        too_big = batcher.submit(_rows(1025, 9))
        for k, f in enumerate(good):
            np.testing.assert_allclose(f.result(), mlp(_rows(2, k)), rtol=1e-5, atol=1e-6)
        with pytest.raises(StaticDimError):
            bad.result()
        with pytest.raises(SymbolRangeError):
            too_big.result()
        assert max(batcher.runner.batches) <= 4  # --max-batch caps the merged rows


def test_asyncio_and_torch_callers(mlp):
    torch = pytest.importorskip("torch")

    async def main(batcher):
        return await asyncio.gather(*[batcher.infer(x=_rows(1, k)) for k in range(16)])

    with L.Batcher(mlp, max_delay_ms=10) as batcher:
        got = asyncio.run(main(batcher))
        t = batcher(torch.from_numpy(_rows(3, 1)))
    for k, y in enumerate(got):
        np.testing.assert_allclose(y, mlp(_rows(1, k)), rtol=1e-5, atol=1e-6)
    assert isinstance(t, torch.Tensor) and t.shape == (3, 32)


def test_only_equal_other_dims_merge():
    m = L.load(built(str(MODELS / "token_ids.py")))  # ids: int64[batch, seq], scale: float32[batch, 8]
    ids = [np.random.default_rng(k).integers(0, 32, (1, 3 + k % 2)) for k in range(6)]
    with L.Batcher(m, max_delay_ms=50) as batcher:
        futures = [batcher.submit(i, np.ones((1, 8), np.float32)) for i in ids]
        for i, f in zip(ids, futures):
            np.testing.assert_array_equal(f.result()[1], i + 1)
    assert batcher.runner.batches == {3: 2}  # seq 3 and seq 4 requests merge among themselves only


def test_without_batch_axis_each_request_runs_alone():
    m = L.load(built(str(MODELS / "dyn_tied.py")))  # x, y: [2, n]: no dim-0 symbol to merge along
    assert batch_axis(m.manifest) is None
    xs = [np.random.default_rng(k).standard_normal((2, 4)).astype(np.float32) for k in range(4)]
    with L.Batcher(m, max_delay_ms=50) as batcher:
        futures = [batcher.submit(x, x[:, 1:]) for x in xs]
        for x, f in zip(xs, futures):
            np.testing.assert_allclose(f.result(), m(x, x[:, 1:]), rtol=1e-6)
    assert batcher.runner.batches == {1: 4}


def test_closed_batcher_refuses_new_requests_and_answers_queued(mlp):
    batcher = L.Batcher(mlp, max_delay_ms=200)
    queued = [batcher.submit(_rows(1, k)) for k in range(5)]
    batcher.close()
    assert all(f.done() and f.exception() is None for f in queued)
    with pytest.raises(BatcherClosedError):
        batcher.submit(_rows(1, 0))
