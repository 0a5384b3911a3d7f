"""The pure-Python twin of ``_native_launch.c``: the argument block of a kernel
signature (:class:`PackState`) and :func:`launch` (see :mod:`._twin`)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import InvalidArgument
from ._twin_args import _refuse, _u64
from ._twin_args import state as _driver

__all__ = ["PackState", "launch"]


class PackState:
    """The argument block of one kernel signature (see ``_native_launch.c``'s ``PackState``)."""

    __slots__ = (
        "_ptrs", "_words", "address", "maps", "meta", "n_ptrs", "ptr_offset", "scalars", "view",
    )  # fmt: skip

    def __init__(
        self,
        storage: Any,
        params: Any,
        ptr_offset: int,
        n_ptrs: int,
        scalars: Sequence[tuple[int, int]],
        metadata: tuple[int, int] | None,
        tensor_maps: Sequence[int],
    ) -> None:
        try:
            self.view = memoryview(storage).cast("B")
            raw = memoryview(params).cast("B")
        except TypeError:
            raise InvalidArgument("storage must be a writable buffer and params a buffer") from None
        if self.view.readonly:
            raise InvalidArgument("storage must be a writable buffer and params a buffer")
        self.ptr_offset, self.n_ptrs = int(ptr_offset), int(n_ptrs)
        if self.n_ptrs < 0:
            raise InvalidArgument(f"n_ptrs must be >= 0, got {n_ptrs}")
        self._inside(self.ptr_offset, 8 * self.n_ptrs, "the pointers")
        self._check_params(raw)
        self.address = int(np.frombuffer(raw, np.uint8).ctypes.data)
        self._ptrs = struct.Struct(f"<{self.n_ptrs}Q")
        self.scalars = [self._slot(s, "scalars") for s in scalars]
        self.maps = [self._slot((off, 128), "tensor_maps") for off in tensor_maps]
        self.meta = None if metadata is None else self._slot(metadata, "metadata")
        self._words: Any = None
        if self.meta is not None and self.meta[1] % 4 == 0 and self.meta[0] % 4 == 0:
            off, size = self.meta
            self._words = self.view[off : off + size].cast("I")

    def _inside(self, off: int, n: int, what: str) -> None:
        if off < 0 or n < 0 or off > len(self.view) - n:
            raise InvalidArgument(
                f"{what} at offset {off} ({n} bytes) lies outside the {len(self.view)}-byte "
                "argument storage"
            )

    def _check_params(self, raw: memoryview) -> None:
        if len(raw) < 8 or len(raw) % 8:
            raise InvalidArgument(
                "the parameter array must be a whole number of 8-byte addresses, got "
                f"{len(raw)} bytes"
            )
        lo = int(np.frombuffer(self.view, np.uint8).ctypes.data) if len(self.view) else 0
        for i, p in enumerate(np.frombuffer(raw, np.uint64).tolist()):
            if p and not lo <= p < lo + len(self.view):
                raise InvalidArgument(f"parameter {i} points outside the argument storage")

    def _slot(self, pair: Any, what: str) -> tuple[int, int]:
        try:
            off, size = (int(v) for v in pair)
        except (TypeError, ValueError):
            raise InvalidArgument(f"{what} must hold (offset, size) pairs, got {pair!r}") from None
        self._inside(off, size, f"a {what} slot")
        return off, size

    def put(self, data: Any, slot: tuple[int, int], what: str, exact: bool) -> None:
        """Copy ``data``'s bytes into ``slot``."""
        try:
            src = memoryview(data).cast("B")
        except TypeError:
            raise InvalidArgument(f"{what} must be bytes-like, got {data!r}") from None
        off, cap = slot
        if len(src) > cap or (exact and len(src) != cap):
            raise InvalidArgument(f"{what} has {len(src)} bytes; its parameter slot holds {cap}")
        self.view[off : off + len(src)] = src

    def fill_pointers(self, pointers: Sequence[int]) -> None:
        """Write the buffer pointers."""
        try:
            self._ptrs.pack_into(self.view, self.ptr_offset, *pointers)
        except (struct.error, TypeError):
            if len(pointers) != self.n_ptrs:
                raise InvalidArgument(
                    f"{len(pointers)} buffer pointers given; the signature has {self.n_ptrs}"
                ) from None
            for p in pointers:
                _u64(p, "a buffer pointer")
            raise

    def fill(self, items: Sequence[Any], slots: list[tuple[int, int]], what: str) -> None:
        """Write a group of scalars or tensor maps."""
        if len(items) != len(slots):
            raise InvalidArgument(f"{len(items)} {what} given; the signature has {len(slots)}")
        exact = what == "tensor maps"
        view = self.view
        for item, slot in zip(items, slots, strict=True):
            if type(item) is bytes:  # the usual case, without a memoryview
                off, cap = slot
                n = len(item)
                if n <= cap and (n == cap or not exact):
                    view[off : off + n] = item
                    continue
            self.put(item, slot, what, exact)

    def put_metadata(self, data: Any) -> None:
        """Write the metadata words (a ``uint32`` array of the slot's length)."""
        if self.meta is None:
            raise InvalidArgument("metadata given, but the signature has none")
        words = self._words
        if words is not None and type(data) is np.ndarray and data.dtype == np.uint32:
            try:
                words[:] = data
                return
            except (ValueError, TypeError):
                pass  # the wrong length: put() says so
        self.put(data, self.meta, "metadata", True)


def launch(
    state: PackState,
    function: Any,
    gx: int,
    gy: int,
    gz: int,
    bx: int,
    by: int,
    bz: int,
    shared: int,
    stream: Any,
    pointers: Sequence[int],
    scalars: Sequence[Any] | None,
    metadata: Any,
    tensor_maps: Sequence[bytes] | None,
) -> Any:
    """Fill the argument block and launch; the ``CUresult``."""
    if type(state) is not PackState:
        raise InvalidArgument(f"state must be a PackState, got {state!r}")
    if not function:
        raise InvalidArgument(f"function must be a loaded kernel, got {function!r}")
    state.fill_pointers(pointers)
    if scalars is not None:
        state.fill(scalars, state.scalars, "scalar groups")
    if metadata is not None:
        state.put_metadata(metadata)
    if tensor_maps is not None:
        state.fill(tensor_maps, state.maps, "tensor maps")
    try:
        return _driver["d"].cuLaunchKernel(
            function, gx, gy, gz, bx, by, bz, shared, stream, state.address, 0
        )[0]
    except Exception:
        names = ("grid x", "grid y", "grid z", "block x", "block y", "block z")
        dims = [(v, w, 32) for v, w in zip((gx, gy, gz, bx, by, bz), names, strict=True)]
        _refuse([(function, "function", 0), *dims, (shared, "shared memory bytes", 32),
                 (stream, "stream", 0)])  # fmt: skip
        raise
