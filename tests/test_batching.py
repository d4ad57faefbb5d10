"""loader/batching.py: which packages batch along which symbol, and merge/split round trips."""

from types import SimpleNamespace

import numpy as np

from tcexport.formats.records import Symbol, TensorSpec
from tcexport.loader.batching import BatchAxis, batch_axis, concat, merge_key, rows, split
from tcexport.loader.dtypes import BFLOAT16


def _manifest(inputs, outputs, symbols):
    return SimpleNamespace(inputs=[TensorSpec(n, "float32", s) for n, s in inputs],
                           outputs=[TensorSpec(n, "float32", s) for n, s in outputs],
                           symbols=[Symbol(*s) for s in symbols])


def test_batch_axis_found_and_refused():
    ok = _manifest([("x", ("batch", 8)), ("m", ("batch", "seq"))], [("y", ("batch", "seq", 4))],
                   [("batch", 1, 64), ("seq", 1, 128)])
    assert batch_axis(ok) == BatchAxis("batch", 1, 64)
    # the symbol appears past dim 0: rows would see each other
    assert batch_axis(_manifest([("x", ("batch", "batch"))], [("y", ("batch",))], [("batch", 1, None)])) is None
    # an output without the symbol at dim 0 (a reduction over the batch)
    assert batch_axis(_manifest([("x", ("batch", 8))], [("y", (8,))], [("batch", 1, None)])) is None
    # a derived dim 0 (2*batch) does not split by rows
    assert batch_axis(_manifest([("x", (["*", 2, "batch"], 8))], [("y", (["*", 2, "batch"],))],
                                [("batch", 1, None)])) is None
    assert batch_axis(_manifest([("x", (4, 8))], [("y", (4,))], [])) is None


def test_limit():
    assert BatchAxis("b", 1, 64).limit(None) == 64
    assert BatchAxis("b", 1, 64).limit(16) == 16
    assert BatchAxis("b", 1, None).limit(None) is None


def test_concat_split_round_trip_keeps_bfloat16_tag():
    rng = np.random.default_rng(0)
    reqs = [[rng.standard_normal((n, 3)).astype(np.float32), np.arange(n * 2, dtype=np.uint16).view(BFLOAT16)
             .reshape(n, 2)] for n in (1, 3, 2)]
    assert len({merge_key(r) for r in reqs}) == 1
    merged = concat(reqs)
    assert merged[0].shape == (6, 3) and merged[1].dtype is BFLOAT16
    back = split(merged, [rows(r) for r in reqs])
    for got, want in zip(back, reqs):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
            assert g.base is None  # a copy: a reply does not keep the batch alive
    assert merge_key(reqs[0]) != merge_key([reqs[0][0][:, :2], reqs[0][1]])
