"""What a cubin says about its kernels, read without the driver.

:func:`kernel_param_sizes` reads the byte size of each parameter of a kernel from the
cubin's ``.nv.info.<symbol>`` section (its ``EIATTR_KPARAM_INFO`` attributes). The CUDA
server checks launches against it where the driver has no ``cuFuncGetParamCount``
(drivers before CUDA 13.1): probing ``cuFuncGetParamInfo`` past the last parameter is a
failing driver call, which compute-sanitizer reports as an error.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["kernel_param_sizes"]

_KPARAM_INFO: Final = 0x17
_CBANK_PARAM_SIZE: Final = 0x19
_SVAL, _HVAL, _BVAL, _NVAL = 4, 3, 2, 1


def kernel_param_sizes(cubin: bytes, symbol: str) -> tuple[int, ...] | None:
    """Each parameter's size in bytes, in order; None when the cubin does not say (not
    an ELF64 cubin, no info section for ``symbol``, or attributes not understood)."""
    try:
        info = _section(cubin, f".nv.info.{symbol}")
        return None if info is None else _sizes(info)
    except (struct.error, IndexError, ValueError):
        return None


def _section(elf: bytes, wanted: str) -> bytes | None:
    if elf[:5] != b"\x7fELF\x02":
        return None
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    header = struct.Struct("<IIQQQQ")

    def at(i: int) -> tuple[int, int, int]:
        name, _, _, _, off, size = header.unpack_from(elf, shoff + i * entsize)
        return name, off, size

    _, str_off, _ = at(names)
    key = wanted.encode()
    for i in range(count):
        name, off, size = at(i)
        start = str_off + name
        if elf[start : elf.index(b"\0", start)] == key:
            return elf[off : off + size]
    return None


def _sizes(info: bytes) -> tuple[int, ...] | None:
    params: dict[int, int] = {}
    bank = None
    p = 0
    while p < len(info):
        fmt, attr = info[p], info[p + 1]
        p += 2
        if fmt == _SVAL:
            (length,) = struct.unpack_from("<H", info, p)
            value = info[p + 2 : p + 2 + length]
            p += 2 + length
            if attr == _KPARAM_INFO:
                _, ordinal, _, bits = struct.unpack_from("<IHHI", value)
                params[ordinal] = (bits >> 18) & 0x3FFF
        elif fmt == _HVAL:
            (value16,) = struct.unpack_from("<H", info, p)
            p += 2
            bank = value16 if attr == _CBANK_PARAM_SIZE else bank
        elif fmt in (_BVAL, _NVAL):
            p += 2
        else:
            return None
    if sorted(params) != list(range(len(params))) or (not params and bank):
        return None
    return tuple(params[i] for i in range(len(params)))
