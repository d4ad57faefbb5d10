"""serving/v2_json.py (the v2 JSON tensor codec of the Ray deployment) and serving/dlpack_bf16.py (BF16 across
DLPack for the Triton backend), without packages: every decode error class, BF16 rounding, and DLPack checked
against torch's own producer and consumer."""

import gc
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.utils.dlpack

from tcexport.formats.records import Symbol, TensorSpec
from tcexport.loader.dtypes import BFLOAT16
from tcexport.serving.dlpack_bf16 import Bf16DLPack, DLPackError, bf16_from_capsule
from tcexport.serving.v2_json import V2RequestError, decode_inputs, encode_outputs, error_body, metadata

MANIFEST = SimpleNamespace(
    model="m", inputs=[TensorSpec("ids", "int64", ("batch", 3)), TensorSpec("x", "bfloat16", ("batch",))],
    outputs=[TensorSpec("y", "bfloat16", ("batch",)), TensorSpec("ok", "bool", ("batch",))],
    symbols=[Symbol("batch", 1, 8)])


def _body(ids=None, x=None):
    ids = ids or {"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [[1, 2, 3]]}
    x = x or {"name": "x", "shape": [1], "datatype": "BF16", "data": [1.0]}
    return {"inputs": [x, ids]}


def test_decode_good_request_in_manifest_order():
    ids, x = decode_inputs(_body(x={"name": "x", "shape": [2], "datatype": "BF16", "data": [1.0, 1.00390625]}),
                           MANIFEST)
    assert ids.dtype == np.int64 and ids.tolist() == [[1, 2, 3]]
    assert x.dtype.metadata == BFLOAT16.metadata  # tagged: the guards read it as bfloat16
    assert x.view(np.uint16).tolist() == [0x3F80, 0x3F80]  # 1 + 2**-8 is a tie: rounds to even (1.0)
    body = encode_outputs([x, np.array([True, False])], MANIFEST, "m", "req-1")
    assert body["id"] == "req-1" and body["outputs"][0] == {"name": "y", "datatype": "BF16", "shape": [2],
                                                            "data": [1.0, 1.0]}
    assert body["outputs"][1]["data"] == [True, False]


@pytest.mark.parametrize("body, match", [
    ([], "JSON object"),
    ({"inputs": [{"name": "zz", "shape": [1], "datatype": "FP32", "data": [1]}]}, "'zz' is not an input"),
    (_body(ids={"name": "ids", "shape": [1, 3], "datatype": "STRING", "data": [1, 2, 3]}), "datatype 'STRING'"),
    (_body(ids={"name": "ids", "shape": [1, -3], "datatype": "INT64", "data": [1, 2, 3]}), "shape must be"),
    (_body(ids={"name": "ids", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3]}), "holds 6 values"),
    (_body(ids={"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1.5, 2, 3]}), "do not fit INT64"),
    (_body(ids={"name": "ids", "shape": [1, 3], "datatype": "INT8", "data": [1, 2, 300]}), "do not fit INT8"),
    (_body(ids={"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": ["a", "b", "c"]}), "hold numbers"),
    (_body(ids={"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [[1], [2, 3]]}), "ragged"),
    (_body(ids={"name": "ids", "shape": [1, 3], "datatype": "BOOL", "data": [1, 0, 1]}), "true/false"),
    ({"inputs": [_body()["inputs"][0]]}, "needs input"),
    ({"inputs": _body()["inputs"] * 2}, "given twice"),
])
def test_decode_errors_name_the_input(body, match):
    with pytest.raises(V2RequestError, match=match) as info:
        decode_inputs(body, MANIFEST)
    assert error_body(info.value)["error_type"] == "V2RequestError"


def test_valid_datatype_other_than_the_package_passes_to_the_guard():
    ids, _ = decode_inputs(_body(ids={"name": "ids", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}),
                           MANIFEST)
    assert ids.dtype == np.int32  # the loader's DtypeError will name it


def test_metadata_has_dynamic_dims_and_ranges():
    meta = metadata(MANIFEST, "m")
    assert meta["inputs"][0] == {"name": "ids", "datatype": "INT64", "shape": [-1, 3]}
    assert meta["symbols"] == [{"name": "batch", "min": 1, "max": 8}]


def test_bf16_dlpack_round_trip_through_torch():
    t = torch.randn(3, 5).to(torch.bfloat16)
    bits = bf16_from_capsule(torch.utils.dlpack.to_dlpack(t), "t")
    assert bits.dtype.metadata == BFLOAT16.metadata and bits.shape == (3, 5)
    np.testing.assert_array_equal(bits.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))
    back = torch.from_dlpack(Bf16DLPack(bits))
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    assert bf16_from_capsule(torch.utils.dlpack.to_dlpack(torch.zeros(0, 4, dtype=torch.bfloat16)), "e").shape == (0, 4)
    assert bf16_from_capsule(torch.utils.dlpack.to_dlpack(torch.tensor(1.5, dtype=torch.bfloat16)), "s").shape == ()
    unconsumed = Bf16DLPack(bits).__dlpack__()
    del unconsumed  # its destructor releases the export
    gc.collect()


def test_bf16_dlpack_refusals():
    with pytest.raises(DLPackError, match="expected a bfloat16"):
        bf16_from_capsule(torch.utils.dlpack.to_dlpack(torch.zeros(2, 2)), "f32")
    strided = torch.zeros(4, 4, dtype=torch.bfloat16)[:, ::2]
    with pytest.raises(DLPackError, match="not C-contiguous"):
        bf16_from_capsule(torch.utils.dlpack.to_dlpack(strided), "strided")
