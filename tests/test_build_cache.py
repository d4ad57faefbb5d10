"""The build cache is re-verified by content before reuse: a poisoned entry is rebuilt, never packaged (before, a
cached ``<key>.so`` was read by path and shipped as it was), and an unsafe cache directory is not used."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from tcexport.exporter.cpu import build

DESCRIPTOR = b'{"abi":1,"isa":"@isa@","probe":true}'
SOURCE = ('#include <cstdint>\nextern "C" const char* tc_abi_descriptor(int64_t* size) {\n'
          '  static const char t[] = "{\\"abi\\":1,\\"isa\\":\\"" TC_ISA "\\",\\"probe\\":true}";\n'
          '  *size = sizeof(t) - 1; return t; }\nextern "C" int tc_answer() { return 42; }\n')
ISA = build.ISA_LEVELS[-1]


def _build(cache_dir, warnings):
    cache = build.BuildCache.open(cache_dir, warnings.append)
    try:
        return build.build_one(SOURCE, ISA, cache, warnings.append, DESCRIPTOR)
    finally:
        if cache is not None:
            cache.close()


def _entry(cache_dir):
    (so,) = cache_dir.glob("*.so")
    return so, so.with_suffix(".json")


def test_cached_library_is_reused_only_when_intact(tmp_path):
    warnings = []
    clean = _build(tmp_path / "c", warnings)
    assert b'"isa":"x86-64"' in clean and not warnings
    so, record = _entry(tmp_path / "c")
    assert json.loads(record.read_text())["sha256"] == hashlib.sha256(clean).hexdigest()
    assert (so.stat().st_mode & 0o777) == 0o400 and ((tmp_path / "c").stat().st_mode & 0o777) == 0o700
    assert _build(tmp_path / "c", warnings) == clean and not warnings  # a hit


def test_poisoned_library_is_rebuilt(tmp_path):
    warnings = []
    clean = _build(tmp_path / "c", warnings)
    so, record = _entry(tmp_path / "c")
    os.chmod(so, 0o600)
    so.write_bytes(b"\x7fELF" + b"\0" * 1000)  # altered: its bytes no longer match the stored SHA-256
    assert _build(tmp_path / "c", warnings) == clean
    assert "do not match the SHA-256" in warnings[-1]


def test_consistently_poisoned_entry_is_rebuilt(tmp_path):
    """An entry whose record was rewritten to match the poisoned bytes still fails the content check: a library
    that does not carry the interface descriptor this source compiles in is not what this build produces."""
    warnings = []
    clean = _build(tmp_path / "c", warnings)
    so, record = _entry(tmp_path / "c")
    foreign = b"\x7fELF" + os.urandom(4096)
    os.chmod(so, 0o600), os.chmod(record, 0o600)
    so.write_bytes(foreign)
    record.write_text(json.dumps({"sha256": hashlib.sha256(foreign).hexdigest()}))
    assert _build(tmp_path / "c", warnings) == clean
    assert "not what this build produces" in warnings[-1]


def test_symlinked_cache_entry_is_not_followed(tmp_path):
    warnings = []
    clean = _build(tmp_path / "c", warnings)
    so, _ = _entry(tmp_path / "c")
    target = tmp_path / "elsewhere.so"
    target.write_bytes(clean)
    so.unlink()
    so.symlink_to(target)
    assert _build(tmp_path / "c", warnings) == clean
    assert not so.is_symlink() or not so.exists()


def test_world_writable_cache_is_not_used(tmp_path):
    (tmp_path / "c").mkdir(mode=0o777)
    os.chmod(tmp_path / "c", 0o777)
    warnings = []
    data = _build(tmp_path / "c", warnings)
    assert data.startswith(b"\x7fELF") and "writable by group and others" in warnings[0]
    assert not list((tmp_path / "c").iterdir())


def test_build_without_descriptor_is_a_build_error(tmp_path):
    with pytest.raises(build.BuildError, match="does not contain its interface descriptor"):
        build.build_one('extern "C" int tc_answer() { return 42; }', ISA, None, None, DESCRIPTOR)
