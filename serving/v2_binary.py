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

from . import v2_json
from .datatypes import v2_datatype
from .v2_json import V2RequestError, _datatype_and_shape, _from_bf16, decode_tensor

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
    offset = 0  # into the binary tail; binary inputs take their bytes in input order

    def decode(entry: dict) -> np.ndarray:
        nonlocal offset
        params = entry.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is None:
            return decode_tensor(entry)
        array = _binary_tensor(entry, size, binary[offset:], entry["name"])
        offset += size
        return array

    def all_bytes_used() -> None:
        if offset != len(binary):
            raise V2RequestError(f"the inputs' binary_data_size add up to {offset} bytes but {len(binary)} follow "
                                 "the JSON header; they must match")

    return v2_json.decode_inputs(header, manifest, decode=decode, finish=all_bytes_used)


def _binary_tensor(entry: dict, size, data: memoryview, name: str) -> np.ndarray:
    dtype, shape = _datatype_and_shape(entry, name)
    np_dtype = numpy_dtype(dtype)
    expected = math.prod(shape) * np_dtype.itemsize
    if isinstance(size, bool) or not isinstance(size, int) or size != expected or size > len(data):
        raise V2RequestError(f"input {name!r}: binary_data_size {size!r} but shape {shape} of {entry['datatype']} "
                             f"takes {expected} bytes ({len(data)} left in the body)", input=name)
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
