"""The weights safetensors member as numpy views of the archive's verified private memory.

The safetensors header is parsed here, not by the safetensors package, because the tensors must be numpy views
of the bytes the archive verified (no second copy) and every offset must be checked against the member's bounds
before a view is made. Views are made from a memoryview, so each holds the memory's buffer and the memory cannot
be closed (or unmapped) under a model that reads it. The layout: u64 little-endian header length N, N bytes of
JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then data.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

from tcexport.formats.dtypes import SAFETENSORS_DTYPES
from tcexport.formats.errors import FormatError
from tcexport.formats.manifest import Manifest

from .archive import Archive
from .arrays import contiguous
from .dtypes import dtype_name, numpy_dtype

MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_RANK = 32  # numpy's limit is 64; no weight comes near either


def load_weights(archive: Archive, manifest: Manifest | None = None) -> dict[str, np.ndarray]:
    """Return name -> numpy view into the archive's verified memory, checked against ``manifest.weights``."""
    manifest = manifest or archive.manifest
    where = f"{archive.path}: {manifest.weights_file}"
    data = archive.view(manifest.weights_file)
    arrays = parse_safetensors(data, where)
    _check_against_manifest(arrays, manifest, where)
    return arrays


def parse_safetensors(data: memoryview, where: str) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file's bytes (views of ``data``), every header field and offset checked;
    FormatError names what is wrong."""
    header, data_start = _read_header(data, where)
    return _make_views(data, header, data_start, len(data), where)


def _read_header(data: memoryview, where: str) -> tuple[dict, int]:
    size = len(data)
    if size < 8:
        raise FormatError(f"{where}: {size} bytes is too short for a safetensors file (needs an 8-byte header length)")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n == 0 or n > MAX_HEADER_BYTES or n > size - 8:
        raise FormatError(f"{where}: safetensors header length {n} is not in 1..{min(MAX_HEADER_BYTES, size - 8)}")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise FormatError(f"{where}: safetensors header is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{where}: safetensors header should be a JSON object")
    header.pop("__metadata__", None)
    return header, 8 + n


def _make_views(data: memoryview, header: dict, data_start: int, data_end: int, where: str) -> dict[str, np.ndarray]:
    data_len = data_end - data_start
    spans = []
    arrays = {}
    for name, entry in header.items():
        dtype, shape, begin, end = _parse_entry(name, entry, where)
        nbytes = _nbytes(shape, numpy_dtype(dtype).itemsize, name, where)
        if not 0 <= begin <= end <= data_len:
            raise FormatError(f"{where}: tensor {name!r} data_offsets [{begin}, {end}] are outside the "
                              f"{data_len} data bytes")
        if end - begin != nbytes:
            raise FormatError(f"{where}: tensor {name!r} is {dtype}{list(shape)} = {nbytes} bytes, "
                              f"but its data_offsets span {end - begin} bytes")
        spans.append((begin, end, name))
        arrays[name] = _view(data, dtype, shape, data_start + begin)
    _check_disjoint(spans, where)
    return arrays


def _parse_entry(name: str, entry, where: str) -> tuple[str, tuple, int, int]:
    if not isinstance(entry, dict):
        raise FormatError(f"{where}: tensor {name!r} header entry should be an object")
    st_dtype = entry.get("dtype")
    if not isinstance(st_dtype, str) or st_dtype not in SAFETENSORS_DTYPES:
        raise FormatError(f"{where}: tensor {name!r} has dtype {st_dtype!r:.80}; known: {sorted(SAFETENSORS_DTYPES)}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_nonneg_int(d) for d in shape):
        raise FormatError(f"{where}: tensor {name!r} shape should be a list of non-negative integers, found {shape!r:.80}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_nonneg_int(o) for o in offsets):
        raise FormatError(f"{where}: tensor {name!r} data_offsets should be [begin, end], found {offsets!r:.80}")
    return SAFETENSORS_DTYPES[st_dtype], tuple(shape), offsets[0], offsets[1]


def _is_nonneg_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62


def _nbytes(shape: tuple, itemsize: int, name: str, where: str) -> int:
    """The tensor's size, checked as it grows: a hostile header's shape cannot make a huge product."""
    n = itemsize
    for d in shape:
        n *= d
        if n >= 1 << 62:
            raise FormatError(f"{where}: tensor {name!r} has shape {list(shape)[:16]}, too large for any file")
    return n


def _check_disjoint(spans: list, where: str) -> None:
    end, previous = 0, None
    for begin, stop, name in sorted(spans):
        if begin < end and begin != stop:
            raise FormatError(f"{where}: tensors {previous!r} and {name!r} overlap in the data section")
        if stop > end:
            end, previous = stop, name


def _view(data: memoryview, dtype: str, shape: tuple, offset: int) -> np.ndarray:
    """A view that holds ``data``'s buffer; misaligned data (never written by tcexport) is copied."""
    np_dtype = numpy_dtype(dtype)
    count = math.prod(shape)
    arr = np.frombuffer(data, dtype=np_dtype, count=count, offset=offset).reshape(shape)
    return arr if offset % np_dtype.itemsize == 0 else arr.copy()


def _check_against_manifest(arrays: dict[str, np.ndarray], manifest: Manifest, where: str) -> None:
    expected = {w.name: w for w in manifest.weights}
    for name in sorted(set(expected) - set(arrays)):
        raise FormatError(f"{where}: weight {name!r} listed in the manifest is missing from the safetensors file")
    for name in sorted(set(arrays) - set(expected)):
        raise FormatError(f"{where}: tensor {name!r} is in the safetensors file but not in manifest.weights")
    for name, spec in expected.items():
        arr = arrays[name]
        got_dtype = dtype_name(arr.dtype)
        if got_dtype != spec.dtype or tuple(arr.shape) != tuple(spec.shape):
            raise FormatError(f"{where}: weight {name!r} is {got_dtype}{list(arr.shape)}; the manifest expects "
                              f"{spec.dtype}{list(spec.shape)}. Rebuild the package.")


# --- safetensors files outside an archive (training: load_weights / save_weights) -------------------------------


def read_safetensors(path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, checked as a package's weights are: read into memory first (a file
    mapped while another process truncates it would raise SIGBUS), then read-only views of those bytes."""
    import pathlib

    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FormatError(f"{path}: cannot read the weights file: {e.strerror or e}") from None
    return parse_safetensors(memoryview(data), str(path))


def safetensors_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """A safetensors file of ``arrays`` (name order, header padded to 8 bytes); bfloat16 bits are labelled BF16,
    which the safetensors package cannot do for numpy arrays without ml_dtypes."""
    codes = {name: code for code, name in SAFETENSORS_DTYPES.items()}
    header, offset, chunks = {}, 0, []
    for name in sorted(arrays):
        arr = contiguous(arrays[name])
        data = arr.tobytes()
        header[name] = {"dtype": codes[dtype_name(arr.dtype)], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)
