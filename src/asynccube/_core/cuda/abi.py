"""The kernel argument ABI: how :class:`~asynccube._core.values.types.Bindings` become the
parameters of a CUDA kernel.

A kernel launched with ``bindings`` takes, in this order:

1. one device pointer (``T*``) per ``bindings.buffers`` entry, its ``offset_start``
   already applied;
2. one ``const __grid_constant__ CUtensorMap`` (128 bytes, by value) per
   ``bindings.tensor_maps`` entry;
3. the scalars, grouped by dtype in the order of ``SCALAR_DTYPES`` (float64, float32,
   float16, int64, int32, int16, int8, uint64, uint32, uint16, uint8), each scalar its
   own by-value parameter of that C type (see :data:`C_TYPES`), in the order given;
4. if the metadata is not empty, ONE by-value ``struct { uint32_t v[N]; }`` holding the
   ``N`` metadata words.

The driver reads each parameter's size from the cubin, so only sizes must agree; the
virtual header ``<asynccube.h>`` (:data:`PRELUDE`, available to every kernel) declares
types that match without any CUDA header: ``ac_tensor_map``, ``ac_metadata<N>``,
``ac_f16`` and fixed-width integers.

Packing is done once per :class:`Signature` into an :class:`ArgPack` (one buffer holding
every argument, aligned, and the ``void*`` array pointing into it); a launch only writes
the values into that buffer and passes the array's address to ``cuLaunchKernel``. The
driver copies the arguments during the call, so the same pack is reused at once.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgument
from ..values.bindings import SCALAR_DTYPES, Bindings, ScalarBinding
from .native.hotpath import hot

__all__ = [
    "C_TYPES",
    "PRELUDE",
    "TENSOR_MAP_BYTES",
    "ArgPack",
    "ArgPacker",
    "Signature",
]

TENSOR_MAP_BYTES: Final = 128
"""Size of a ``CUtensorMap`` (64-byte aligned)."""

C_TYPES: Final[dict[np.dtype[np.generic], str]] = dict(
    zip(
        SCALAR_DTYPES,
        (
            "double",
            "float",
            "ac_f16",
            "long long",
            "int",
            "short",
            "signed char",
            "unsigned long long",
            "unsigned int",
            "unsigned short",
            "unsigned char",
        ),
        strict=True,
    )
)
"""The C type of each scalar dtype's parameters (any type of the same size works)."""

PRELUDE: Final = r"""
#pragma once
/* asynccube kernel ABI types: usable without any CUDA header. */
typedef signed char ac_i8;
typedef short ac_i16;
typedef int ac_i32;
typedef long long ac_i64;
typedef unsigned char ac_u8;
typedef unsigned short ac_u16;
typedef unsigned int ac_u32;
typedef unsigned long long ac_u64;
/* Same size and alignment as __half: the raw bits of a float16 scalar. */
struct __align__(2) ac_f16 { unsigned short bits; };
/* Same size and alignment as CUtensorMap: pass as `const __grid_constant__`. */
struct __align__(64) ac_tensor_map { unsigned long long opaque[16]; };
/* The metadata words of a launch, passed by value as one parameter. */
template <int N> struct ac_metadata { unsigned int v[N]; };
"""
"""The virtual header ``<asynccube.h>`` that every kernel may include."""


class Signature:
    """What a launch's parameter list looks like, independent of the values.

    Attributes:
        buffers: Number of buffer (pointer) parameters.
        tensor_maps: Number of tensor-map parameters.
        scalars: ``(dtype, count)`` per scalar group, in ABI order.
        metadata: Number of ``uint32`` metadata words (0: no metadata parameter).
    """

    __slots__ = ("buffers", "key", "metadata", "scalars", "tensor_maps")

    def __init__(
        self,
        buffers: int,
        tensor_maps: int = 0,
        scalars: Sequence[tuple[npt.DTypeLike, int]] = (),
        metadata: int = 0,
    ) -> None:
        self.buffers = buffers
        self.tensor_maps = tensor_maps
        self.scalars = tuple((np.dtype(t), int(n)) for t, n in scalars)
        self.metadata = metadata
        _check_order(self.scalars)
        self.key = (buffers, tensor_maps, tuple((t.num, n) for t, n in self.scalars), metadata)

    @classmethod
    def of(cls, bindings: Bindings) -> Signature:
        """The signature of ``bindings``."""
        scalars = [(s.ty, s.length) for s in bindings.ordered_scalars()]
        return cls(
            len(bindings.buffers), len(bindings.tensor_maps), scalars, len(bindings.metadata)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        sc = ", ".join(f"{t.name}x{n}" for t, n in self.scalars)
        return (
            f"Signature(buffers={self.buffers}, tensor_maps={self.tensor_maps}, "
            f"scalars=[{sc}], metadata={self.metadata})"
        )

    def param_sizes(self) -> list[int]:
        """Byte size of each kernel parameter, in order (for checking a kernel's own)."""
        sizes = [8] * self.buffers + [TENSOR_MAP_BYTES] * self.tensor_maps
        for dt, n in self.scalars:
            sizes += [dt.itemsize] * n
        return sizes + ([4 * self.metadata] if self.metadata else [])

    def c_params(self, buffer_type: str | Sequence[str] = "float") -> str:
        """A C parameter list matching this signature (for writing or testing kernels).

        ``buffer_type`` is the pointee type of every buffer, or one per buffer.
        """
        types = [buffer_type] * self.buffers if isinstance(buffer_type, str) else buffer_type
        if len(types) != self.buffers:
            raise InvalidArgument(f"need {self.buffers} buffer types, got {len(types)}")
        out = [f"{t}* b{i}" for i, t in enumerate(types)]
        out += [f"const __grid_constant__ ac_tensor_map t{i}" for i in range(self.tensor_maps)]
        for dt, n in self.scalars:
            out += [f"{C_TYPES[dt]} {dt.name}_{i}" for i in range(n)]
        if self.metadata:
            out.append(f"ac_metadata<{self.metadata}> meta")
        return ", ".join(out)


_ORDER: Final = {dt: i for i, dt in enumerate(SCALAR_DTYPES)}


def _check_order(scalars: tuple[tuple[np.dtype[np.generic], int], ...]) -> None:
    ranks = [_ORDER.get(dt, -1) for dt, _ in scalars]
    if -1 in ranks or ranks != sorted(set(ranks)):
        raise InvalidArgument(
            f"scalar groups must be distinct SCALAR_DTYPES in ABI order, got "
            f"{[dt.name for dt, _ in scalars]}"
        )


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


class ArgPack:
    """The reusable argument block of one :class:`Signature`.

    ``storage`` holds every argument at an aligned offset: tensor maps first (64-byte
    aligned), then the buffer pointers, the scalar groups (each a dense array of its
    dtype, 8-byte aligned) and the metadata. ``params`` is the ``void*[n]`` array
    ``cuLaunchKernel`` reads; ``address`` is its address. Both stay put for the life of
    the pack; :meth:`pack` only overwrites values.
    """

    __slots__ = (
        "_meta",
        "_meta_off",
        "_ptr_off",
        "_ptrs",
        "_raw",
        "_scalar_off",
        "_tmap_off",
        "address",
        "params",
        "signature",
        "state",
        "storage",
        "view",
    )

    def __init__(self, signature: Signature) -> None:
        self.signature = sig = signature
        offsets, size = self._layout(sig)
        self._raw = np.zeros(size + 64, dtype=np.uint8)
        start = -self._raw.ctypes.data % 64
        self.storage = self._raw[start : start + size]
        self.view = memoryview(self.storage)  # type: ignore[arg-type]
        base = self.storage.ctypes.data
        self.params = np.array([base + o for o in offsets], dtype=np.uint64)
        if not len(self.params):
            self.params = np.zeros(1, dtype=np.uint64)
        self.address: int = self.params.ctypes.data
        self._ptrs = struct.Struct(f"<{sig.buffers}Q")
        meta_at = self._meta_off
        meta = np.frombuffer(self._raw, np.uint32, sig.metadata, start + meta_at)
        self._meta = memoryview(meta)  # type: ignore[arg-type]
        scalar_slots = [
            (off, _align(dt.itemsize * n, 8))
            for off, (dt, n) in zip(self._scalar_off, sig.scalars, strict=True)
        ]
        self.state: Any = hot.PackState(
            self.storage,
            self.params,
            self._ptr_off,
            sig.buffers,
            scalar_slots,
            (meta_at, 4 * sig.metadata) if sig.metadata else None,
            self._tmap_off,
        )

    def _layout(self, sig: Signature) -> tuple[list[int], int]:
        self._tmap_off = [i * TENSOR_MAP_BYTES for i in range(sig.tensor_maps)]
        self._ptr_off = at = sig.tensor_maps * TENSOR_MAP_BYTES
        ptrs = [at + 8 * i for i in range(sig.buffers)]
        at += 8 * sig.buffers
        self._scalar_off = []
        scalars = []
        for dt, n in sig.scalars:
            self._scalar_off.append(at)
            scalars += [at + dt.itemsize * i for i in range(n)]
            at = _align(at + dt.itemsize * n, 8)
        self._meta_off = at
        meta = [at] if sig.metadata else []
        size = at + 4 * sig.metadata
        return ptrs + self._tmap_off + scalars + meta, max(size, 8)

    def pack(
        self,
        pointers: Sequence[int],
        scalars: Sequence[ScalarBinding] = (),
        metadata: npt.NDArray[np.uint32] | None = None,
        tensor_maps: Sequence[bytes] = (),
    ) -> int:
        """Write one launch's values; return the ``kernelParams`` address.

        ``scalars`` are the bindings' groups in ABI order (``ordered_scalars()``);
        ``tensor_maps`` the 128-byte encoded maps. The values must match the signature
        (as :class:`ArgPacker` guarantees): counts are not re-checked here.
        """
        view = self.view
        self._ptrs.pack_into(view, self._ptr_off, *pointers)
        if scalars:
            for off, sb in zip(self._scalar_off, scalars, strict=False):
                data = sb.data
                view[off : off + len(data)] = data
        if metadata is not None:
            self._meta[:] = metadata  # type: ignore[call-overload]  # fastest copy here
        if tensor_maps:
            for off, tm in zip(self._tmap_off, tensor_maps, strict=False):
                view[off : off + TENSOR_MAP_BYTES] = tm
        return self.address

    def param_bytes(self, index: int, size: int) -> bytes:
        """The ``size`` bytes parameter ``index`` points at (for tests and debugging)."""
        addr = int(self.params[index]) - self.storage.ctypes.data
        return bytes(self.view[addr : addr + size])


class ArgPacker:
    """One :class:`ArgPack` per signature seen, built on first use and then reused."""

    __slots__ = ("_packs",)

    def __init__(self) -> None:
        self._packs: dict[tuple[object, ...], ArgPack] = {}

    def __len__(self) -> int:
        return len(self._packs)

    def get(self, bindings: Bindings) -> tuple[ArgPack, list[ScalarBinding]]:
        """The pack for ``bindings``' signature, and its scalar groups in ABI order."""
        groups = bindings.scalars
        if not groups:
            scalars: list[ScalarBinding] = []
            skey: tuple[tuple[int, int], ...] = ()
        elif len(groups) == 1:
            scalars = list(groups.values())
            only = scalars[0]
            skey = ((only.ty.num, only.length),)
        else:
            scalars = bindings.ordered_scalars()
            skey = tuple([(s.ty.num, s.length) for s in scalars])
        key = (len(bindings.buffers), len(bindings.tensor_maps), skey, bindings.metadata.data.size)
        pack = self._packs.get(key)
        if pack is None:
            pack = self._packs[key] = ArgPack(Signature.of(bindings))
        return pack, scalars

    def pack(
        self, bindings: Bindings, pointers: Sequence[int], tensor_maps: Sequence[bytes] = ()
    ) -> int:
        """Pack one launch of ``bindings`` (device ``pointers`` per buffer, offsets applied)."""
        pack, scalars = self.get(bindings)
        if len(tensor_maps) != pack.signature.tensor_maps:
            raise InvalidArgument(
                f"{len(tensor_maps)} encoded tensor maps for "
                f"{pack.signature.tensor_maps} tensor map bindings"
            )
        meta = bindings.metadata.data
        return pack.pack(pointers, scalars, meta if meta.size else None, tensor_maps)
