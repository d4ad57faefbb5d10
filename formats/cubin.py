"""What a cubin says about its own kernel, read from its ELF without a GPU, and the check of a launch against it.

A manifest's launch list says what to pass to each kernel; the cubin says what the kernel takes. The CUDA loader
checks the two agree before a cubin reaches the driver (SPEC §6a): the entry function exists, its parameters
(``EIATTR_KPARAM_INFO`` in ``.nv.info.<function>``) are as many and as wide as the launch's parameters plus
Triton's two scratch pointers, and its required block size (``EIATTR_REQNTID``) is the launch's warps x 32. A
manifest edited to pass another number or width of arguments, or another block size, is then a FormatError
rather than a kernel reading garbage. The ELF is read for hostile input: every offset is bounds-checked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import FormatError

EM_CUDA = 190
_SHT_SYMTAB = 2
_STT_FUNC = 2
_EIFMT_SVAL = 4
_EIATTR_REQNTID = 0x10
_EIATTR_KPARAM_INFO = 0x17
_TRITON_TRAILING = 2  # Triton kernels end with the global and the profile scratch pointers (SPEC §6a)


@dataclass(frozen=True)
class KernelInfo:
    """One entry function of a cubin, as its ELF describes it."""
    arch: int                 # the sm_XX it was compiled for
    function: str
    param_sizes: tuple        # bytes of each parameter, in ordinal order
    block: tuple | None       # the block size the kernel requires (REQNTID), or None if it states none


def _u(fmt: str, data: bytes, at: int, what: str):
    try:
        return struct.unpack_from(fmt, data, at)
    except struct.error:
        raise FormatError(f"cubin: {what} at offset {at} runs past the end of the file") from None


def cubin_arch(data: bytes) -> int:
    """The sm_XX a cubin is for, from its ELF header (EI_ABIVERSION 7 keeps it in e_flags' low byte, 8 in the
    next one)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 \
            or int.from_bytes(data[18:20], "little") != EM_CUDA:
        raise FormatError("cubin: not a 64-bit little-endian CUDA ELF")
    flags = int.from_bytes(data[48:52], "little")
    return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF


def kernel_info(data: bytes, function: str) -> KernelInfo:
    """``function``'s parameters and block size from the cubin's ELF; FormatError if it has no such entry."""
    arch = cubin_arch(data)
    sections = _sections(data)
    names = {name: (off, size, typ, link) for name, off, size, typ, link in sections}
    if not _has_function(data, sections, function):
        raise FormatError(f"cubin: has no kernel function {function[:80]!r}")
    info = names.get(f".nv.info.{function}")
    if info is None:
        raise FormatError(f"cubin: kernel {function!r} has no .nv.info section describing its parameters")
    params, block = _attributes(data, info[0], info[1], function)
    ordinals = sorted(params)
    if ordinals != list(range(len(ordinals))):
        raise FormatError(f"cubin: kernel {function!r} describes parameter ordinals {ordinals[:16]}, not 0..n-1")
    return KernelInfo(arch, function, tuple(params[k] for k in ordinals), block)


def _sections(data: bytes) -> list:
    """(name, offset, size, type, link) of every section, each inside the file."""
    (shoff,) = _u("<Q", data, 0x28, "the section header offset")
    shentsize, shnum, shstrndx = _u("<HHH", data, 0x3A, "the section header counts")
    if shentsize != 64 or not 0 < shnum <= 4096 or shstrndx >= shnum or shoff + shnum * 64 > len(data):
        raise FormatError("cubin: malformed section header table")
    raw = []
    for k in range(shnum):
        name, typ, _, _, off, size, link, _, _, _ = _u("<IIQQQQIIQQ", data, shoff + k * 64, "a section header")
        if typ != 8 and off + size > len(data):  # 8: SHT_NOBITS, which occupies no file bytes
            raise FormatError(f"cubin: section {k} ({size} bytes at {off}) runs past the end of the file")
        raw.append((name, off, size, typ, link))
    str_off, str_size = raw[shstrndx][1], raw[shstrndx][2]
    return [(_string(data, str_off, str_size, name), off, size, typ, link) for name, off, size, typ, link in raw]


def _string(data: bytes, table: int, size: int, at: int) -> str:
    if at >= size:
        raise FormatError("cubin: a name points outside its string table")
    end = data.find(b"\0", table + at, table + size)
    if end < 0:
        raise FormatError("cubin: an unterminated name in a string table")
    return data[table + at:end].decode("utf-8", errors="replace")


def _has_function(data: bytes, sections: list, function: str) -> bool:
    for _, off, size, typ, link in sections:
        if typ != _SHT_SYMTAB or link >= len(sections):
            continue
        str_off, str_size = sections[link][1], sections[link][2]
        for at in range(off, off + size - 23, 24):
            name, info = _u("<IB", data, at, "a symbol")
            if info & 0xF == _STT_FUNC and _string(data, str_off, str_size, name) == function:
                return True
    return False


def _attributes(data: bytes, off: int, size: int, function: str) -> tuple[dict, tuple | None]:
    """{ordinal: size} from KPARAM_INFO records and the REQNTID block, from one .nv.info section."""
    params, block, at, end = {}, None, off, off + size
    while at + 4 <= end:
        fmt, attr, value = _u("<BBH", data, at, "an .nv.info record")
        at += 4
        if fmt != _EIFMT_SVAL:
            continue
        if at + value > end:
            raise FormatError(f"cubin: kernel {function!r}: an .nv.info record runs past its section")
        if attr == _EIATTR_KPARAM_INFO and value >= 12:
            _, ordinal, _, flags = _u("<IHHI", data, at, "a parameter record")
            params[ordinal] = flags >> 18
        elif attr == _EIATTR_REQNTID and value >= 12:
            block = _u("<III", data, at, "the block size record")
        at += value
    return params, block


def check_launch(data: bytes, launch, cubin, arch: int, where: str) -> None:
    """The cubin file ``data`` of ``cubin`` (manifest.Cubin) runs ``launch`` (manifest.Launch) on sm_``arch``:
    its arch, its parameters' count and widths, and its block size. FormatError names the launch otherwise."""
    try:
        info = kernel_info(data, cubin.function)
    except FormatError as e:
        raise FormatError(f"{where}: launch {launch.name!r}: {e}") from None
    if info.arch != arch:
        raise FormatError(f"{where}: launch {launch.name!r}: its cubin is for sm_{info.arch}, its bundle for "
                          f"sm_{arch}; rebuild the package")
    symbol = 4 if launch.index_bits == 32 else 8
    want = tuple(symbol if p["kind"] == "symbol" else 8 for p in launch.params) + (8,) * _TRITON_TRAILING
    if info.param_sizes != want:
        raise FormatError(f"{where}: launch {launch.name!r} passes {len(want)} parameters of {list(want)[:24]} bytes, "
                          f"but kernel {cubin.function!r} takes {len(info.param_sizes)} of "
                          f"{list(info.param_sizes)[:24]}. The manifest was edited or belongs to other cubins; "
                          f"rebuild the package.")
    threads = cubin.num_warps * 32
    if info.block is not None and tuple(info.block) != (threads, 1, 1):
        raise FormatError(f"{where}: launch {launch.name!r} runs {cubin.num_warps} warps ({threads} threads), but "
                          f"kernel {cubin.function!r} requires a block of {list(info.block)}; rebuild the package.")
