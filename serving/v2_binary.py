"""The v2 protocol's binary tensor data extension: a JSON header followed by raw tensor bytes, both ways.

A request says how long its JSON header is (``Inference-Header-Content-Length``); an input whose ``parameters``
carry ``binary_data_size`` takes that many bytes from what follows the header, in input order, as the tensor's
little-endian row-major values (BOOL one byte each, BF16 its 16 bits; the loader runs on little-endian hosts). A response carries outputs as binary when
the request asks (``parameters.binary_data_output``, or an output's own ``parameters.binary_data``), with the
same header length field. JSON inputs and binary inputs may mix in one request (v2_json.py reads the JSON ones).
Every size is checked against the shape and the datatype before a byte is used.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from tcexport.loader.dtypes import numpy_dtype

from .datatypes import manifest_dtype, v2_datatype
from .v2_json import V2RequestError, _from_bf16, decode_tensor

HEADER = "inference-header-content-length"
assert sys.byteorder == "little", "the binary extension's bytes are little-endian, as the loader's hosts are"


def split_body(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """The JSON header of a request and the binary bytes after it (none without the header length field)."""
    if header_length is None:
        return _json(body), memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise V2RequestError(f"Inference-Header-Content-Length {header_length!r} should be an integer between 0 "
                             f"and the body's {len(body)} bytes")
    return _json(body[:n]), memoryview(body)[n:]


def _json(data: bytes) -> dict:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise V2RequestError(f"request body is not valid JSON ({e}); send a v2 inference request object") from None


def decode_inputs(header: dict, binary: memoryview, manifest) -> list[np.ndarray]:
    """The request's arrays in manifest order: JSON ``data`` or ``binary_data_size`` bytes per input."""
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise V2RequestError('request body must be a JSON object with an "inputs" list of '
                             '{"name", "shape", "datatype", "data"} objects')
    names = [s.name for s in manifest.inputs]
    given: dict[str, np.ndarray] = {}
    offset = 0
    for entry in header["inputs"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in names:
            raise V2RequestError(f"input {name!r} is not an input of model {manifest.model!r}; its inputs are "
                                 f"{', '.join(names)}", input=name if isinstance(name, str) else None)
        if name in given:
            raise V2RequestError(f"input {name!r} is given twice; give each input once", input=name)
        params = entry.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is None:
            given[name] = decode_tensor(entry)
            continue
        given[name] = _binary_tensor(entry, size, binary[offset:], name)
        offset += size
    if offset != len(binary):
        raise V2RequestError(f"the inputs' binary_data_size add up to {offset} bytes but {len(binary)} follow the "
                             "JSON header; they must match")
    missing = [n for n in names if n not in given]
    if missing:
        raise V2RequestError(f"model {manifest.model!r} needs input(s) {', '.join(missing)}; the request has "
                             f"{', '.join(given) or 'none'}", input=missing[0])
    return [given[n] for n in names]


def _binary_tensor(entry: dict, size, data: memoryview, name: str) -> np.ndarray:
    datatype = entry.get("datatype")
    dtype = manifest_dtype(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise V2RequestError(f"input {name!r}: datatype {datatype!r} is not a v2 datatype tcexport packages hold "
                             f"(FP64, FP32, FP16, BF16, INT64, INT32, INT16, INT8, UINT8, BOOL)", input=name)
    shape = entry.get("shape")
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise V2RequestError(f"input {name!r}: shape must be a list of integers >= 0, got {shape!r}", input=name)
    np_dtype = numpy_dtype(dtype)
    expected = math.prod(shape) * np_dtype.itemsize
    if isinstance(size, bool) or not isinstance(size, int) or size != expected or size > len(data):
        raise V2RequestError(f"input {name!r}: binary_data_size {size!r} but shape {shape} of {datatype} takes "
                             f"{expected} bytes ({len(data)} left in the body)", input=name)
    array = np.frombuffer(data[:size], dtype=np.uint8).copy()  # a copy: the request's bytes are not kept
    if dtype == "bool" and array.size and array.max() > 1:
        raise V2RequestError(f"input {name!r}: BOOL bytes must be 0 or 1", input=name)
    return array.view(np_dtype).reshape(shape)


def wants_binary(header: dict) -> tuple[bool, set]:
    """(all outputs as binary, names of outputs asked for as binary one by one)."""
    params = header.get("parameters") if isinstance(header, dict) else None
    every = bool(params.get("binary_data_output")) if isinstance(params, dict) else False
    named = set()
    for out in header.get("outputs") or [] if isinstance(header, dict) else []:
        if isinstance(out, dict) and isinstance(out.get("parameters"), dict) and out["parameters"].get("binary_data"):
            named.add(out.get("name"))
    return every, named


def encode_response(outputs, manifest, model_name: str, version: str, request_id, every: bool,
                    named: set) -> tuple[bytes, dict]:
    """The response body and its extra headers: JSON only, or a JSON header and the binary outputs after it."""
    body = {"model_name": model_name, "model_version": version, "outputs": []}
    if request_id is not None:
        body["id"] = request_id
    blobs = []
    for spec, array in zip(manifest.outputs, outputs):
        entry = {"name": spec.name, "datatype": v2_datatype(spec.dtype), "shape": list(array.shape)}
        if every or spec.name in named:
            blobs.append(np.ascontiguousarray(array).tobytes())
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            values = _from_bf16(array) if spec.dtype == "bfloat16" else array
            entry["data"] = values.reshape(-1).tolist()
        body["outputs"].append(entry)
    text = json.dumps(body).encode()
    if not blobs:
        return text, {}
    return text + b"".join(blobs), {"Inference-Header-Content-Length": str(len(text))}
