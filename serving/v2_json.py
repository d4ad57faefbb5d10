"""The JSON tensor form of the KServe / Open Inference Protocol v2, for engines that carry request bodies as
JSON (the Ray Serve deployment): a request's ``{"inputs": [{"name", "shape", "datatype", "data"}]}`` to arrays in
the package's input order, arrays back to ``{"outputs": [...]}``, and a model's metadata.

Decoding is strict and every problem is a ``V2RequestError`` naming the input: an unknown or missing input name,
a datatype the protocol does not define, a shape that is not a list of non-negative integers, data whose length
disagrees with the shape, values that do not fit the datatype (1.5 for INT64, 300 for UINT8, a string). A
datatype that is valid but not the package's is passed on, so the loader's guard raises its DtypeError. BF16
travels in JSON as numbers, rounded to bfloat16 to nearest even.
"""

from __future__ import annotations

import math

import numpy as np

from tcexport.formats.errors import TcError
from tcexport.loader.dtypes import BFLOAT16, numpy_dtype

from .datatypes import manifest_dtype, v2_datatype


class V2RequestError(TcError):
    """A v2 request body that cannot be read as the model's inputs. ``input`` names the tensor at fault."""

    exit_code = 5

    def __init__(self, message: str, *, input: str | None = None):
        super().__init__(message)
        self.input = input


def decode_inputs(body, manifest, decode=None, finish=None) -> list[np.ndarray]:
    """The arrays of a v2 request body, in the manifest's input order. ``decode`` reads one entry whose name
    passed the checks (default: its JSON ``data``), so v2_binary shares the checks; ``finish`` runs after the
    last entry and before missing inputs are named, for checks across all entries (the binary tail's length)."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise V2RequestError('request body must be a JSON object with an "inputs" list of '
                             '{"name", "shape", "datatype", "data"} objects')
    decode = decode or decode_tensor
    names = [s.name for s in manifest.inputs]
    given: dict[str, np.ndarray] = {}
    for entry in body["inputs"]:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in names:
            raise V2RequestError(f"input {name!r} is not an input of model {manifest.model!r}; its inputs are "
                                 f"{', '.join(names)}", input=name if isinstance(name, str) else None)
        if name in given:
            raise V2RequestError(f"input {name!r} is given twice; give each input once", input=name)
        given[name] = decode(entry)
    if finish is not None:
        finish()
    missing = [n for n in names if n not in given]
    if missing:
        raise V2RequestError(f"model {manifest.model!r} needs input(s) {', '.join(missing)}; the request has "
                             f"{', '.join(given) or 'none'}", input=missing[0])
    return [given[n] for n in names]


def decode_tensor(entry: dict) -> np.ndarray:
    """One ``{"name", "shape", "datatype", "data"}`` object as an array of its datatype and shape."""
    name = entry["name"]
    dtype, shape = _datatype_and_shape(entry, name)
    values = _flat_values(entry.get("data"), name)
    if len(values) != math.prod(shape):
        raise V2RequestError(f"input {name!r}: shape {shape} holds {math.prod(shape)} values, data has "
                             f"{len(values)}", input=name)
    return _typed(values, dtype, name).reshape(shape)


def _datatype_and_shape(entry: dict, name: str) -> tuple[str, list[int]]:
    """The entry's manifest dtype and shape, checked before any data is read, for JSON and binary data alike."""
    datatype = entry.get("datatype")
    dtype = manifest_dtype(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise V2RequestError(f"input {name!r}: datatype {datatype!r} is not a v2 datatype tcexport packages hold "
                             f"(FP64, FP32, FP16, BF16, INT64, INT32, INT16, INT8, UINT8, BOOL)", input=name)
    shape = entry.get("shape")
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise V2RequestError(f"input {name!r}: shape must be a list of integers >= 0, got {shape!r}", input=name)
    return dtype, shape


def _flat_values(data, name: str) -> np.ndarray:
    if not isinstance(data, list):
        raise V2RequestError(f"input {name!r}: data must be a JSON list (flat or nested), got "
                             f"{type(data).__name__}", input=name)
    try:
        values = np.asarray(data)
    except ValueError:
        raise V2RequestError(f"input {name!r}: nested data is ragged; give a flat list in row-major order",
                             input=name) from None
    if values.dtype.kind not in "biuf":
        raise V2RequestError(f"input {name!r}: data must hold numbers (or booleans for BOOL), got "
                             f"{values.dtype.kind!r} values", input=name)
    return values.reshape(-1)


def _typed(values: np.ndarray, dtype: str, name: str) -> np.ndarray:
    if dtype == "bool":
        if values.dtype.kind != "b":
            raise V2RequestError(f"input {name!r}: BOOL data must be true/false", input=name)
        return values.astype(np.bool_)
    if dtype == "bfloat16":
        return _to_bf16(values.astype(np.float32))
    target = numpy_dtype(dtype)
    if values.dtype.kind == "b":
        raise V2RequestError(f"input {name!r}: {v2_datatype(dtype)} data must be numbers, got booleans", input=name)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(target)
        fits = target.kind == "f" or (np.all(np.isfinite(values)) and np.array_equal(out, values))
    if not fits:
        raise V2RequestError(f"input {name!r}: values do not fit {v2_datatype(dtype)} (fractions, or outside its "
                             f"range)", input=name)
    return out


def _to_bf16(f32: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (NaN kept a quiet NaN)."""
    bits = f32.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[np.isnan(f32)] = 0x7FC0
    return rounded.view(BFLOAT16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode_outputs(outputs, manifest, model_name: str, request_id=None) -> dict:
    """The v2 response body for a call's outputs (manifest order)."""
    body = {"model_name": model_name, "outputs": []}
    if request_id is not None:
        body["id"] = request_id
    for spec, array in zip(manifest.outputs, outputs):
        values = _from_bf16(array) if spec.dtype == "bfloat16" else array
        body["outputs"].append({"name": spec.name, "datatype": v2_datatype(spec.dtype), "shape": list(array.shape),
                                "data": values.reshape(-1).tolist()})
    return body


def metadata(manifest, model_name: str) -> dict:
    """The v2 model metadata: inputs and outputs with v2 datatypes, -1 for a dynamic dim, and the symbols'
    ranges (an extra field)."""
    def tensors(specs):
        return [{"name": s.name, "datatype": v2_datatype(s.dtype),
                 "shape": [d if isinstance(d, int) else -1 for d in s.shape]} for s in specs]
    return {"name": model_name, "platform": "tcexport", "inputs": tensors(manifest.inputs),
            "outputs": tensors(manifest.outputs),
            "symbols": [{"name": s.name, "min": s.min, "max": s.max} for s in manifest.symbols]}


def error_body(err: Exception) -> dict:
    """The JSON of an error response: the typed error's class and message, and the fields it names."""
    body = {"error": str(err), "error_type": type(err).__name__}
    for field in ("input", "dim", "symbol", "expected", "got"):
        value = getattr(err, field, None)
        if value is not None:
            body[field] = value if isinstance(value, (int, float, str, bool, list)) else str(value)
    return body
