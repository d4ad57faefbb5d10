"""Weights are numpy views into the archive mapping, validated against the safetensors header and manifest."""

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from loader_helpers import build_package, default_members, make_manifest, spec
from tcexport.formats.errors import FormatError
from tcexport.loader.archive import open_archive
from tcexport.loader.dtypes import dtype_name
from tcexport.loader.weights import load_weights

ALL_DTYPES = {"a": np.arange(6, dtype=np.float64).reshape(2, 3), "b": np.ones((3,), np.float32),
              "c": np.full((2, 2), 0.5, np.float16), "d": np.arange(4, dtype=np.int64),
              "e": np.arange(4, dtype=np.int32), "f": np.arange(3, dtype=np.int16), "g": np.arange(3, dtype=np.int8),
              "h": np.arange(3, dtype=np.uint8), "i": np.array([True, False]), "empty": np.zeros((0, 4), np.float32)}


def _package(tmp_path, tensors, weight_specs=None, raw=None):
    members = default_members()
    members["weights.safetensors"] = raw if raw is not None else st_save(tensors)
    specs = weight_specs if weight_specs is not None else tuple(
        spec(n, dtype_name(a.dtype), a.shape) for n, a in sorted(tensors.items()))
    return open_archive(build_package(tmp_path / "w.tcpkg", make_manifest(weights=specs), members))


def test_round_trip_all_dtypes_without_copy(tmp_path):
    archive = _package(tmp_path, ALL_DTYPES)
    arrays = load_weights(archive)
    assert set(arrays) == set(ALL_DTYPES)
    for name, want in ALL_DTYPES.items():
        got = arrays[name]
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
        base = got
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is archive.memory, name  # a view, not a copy


def test_views_are_writable_copy_on_write(tmp_path):
    archive = _package(tmp_path, {"b": np.ones((3,), np.float32)})
    before = archive.path.read_bytes()
    arr = load_weights(archive)["b"]
    arr[0] = 42.0
    assert archive.path.read_bytes() == before


def test_bfloat16_is_tagged_uint16(tmp_path):
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)   # 1.0, 2.0
    header = {"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}
    raw = _raw_safetensors(header, bits.tobytes())
    arr = load_weights(_package(tmp_path, None, (spec("x", "bfloat16", [2]),), raw))["x"]
    assert dtype_name(arr.dtype) == "bfloat16" and arr.view(np.uint16).tolist() == [0x3F80, 0x4000]


def test_manifest_mismatch_rejected(tmp_path):
    with pytest.raises(FormatError, match=r"weight 'b' is float32\[3\]; the manifest expects float32\[4\]"):
        load_weights(_package(tmp_path, {"b": np.ones(3, np.float32)}, (spec("b", "float32", [4]),)))
    with pytest.raises(FormatError, match="missing"):
        load_weights(_package(tmp_path, {"b": np.ones(3, np.float32)},
                              (spec("b", "float32", [3]), spec("c", "float32", [3]))))
    with pytest.raises(FormatError, match="not in manifest.weights"):
        load_weights(_package(tmp_path, {"b": np.ones(3, np.float32), "c": np.ones(1, np.float32)},
                              (spec("b", "float32", [3]),)))


def _raw_safetensors(header: dict, data: bytes, header_len: int | None = None) -> bytes:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if header_len is None else header_len) + h + data


@pytest.mark.parametrize("header, data, header_len, match", [
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 10 ** 12, "header length"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 0, "header length"),
    ({"x": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16, None, "dtype"),
    ({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "span 8 bytes"),
    ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "outside"),
    ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "shape"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}, b"\0" * 8, None, "data_offsets"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None, "overlap"),
    ([1, 2], b"", None, "JSON object"),
])
def test_hostile_safetensors_rejected(tmp_path, header, data, header_len, match):
    raw = _raw_safetensors(header, data, header_len)
    with pytest.raises(FormatError, match=match):
        load_weights(_package(tmp_path, None, (), raw))


def test_garbage_header_json_rejected(tmp_path):
    raw = struct.pack("<Q", 8) + b"{notjson"
    with pytest.raises(FormatError, match="not valid JSON"):
        load_weights(_package(tmp_path, None, (), raw))
