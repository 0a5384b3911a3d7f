"""Kernels: a stable id plus one part per server (CUDA source, host function)."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ..errors import ExecutionError, InvalidArgument, KernelNotSupported
from .bindings import TensorMapBinding, _is_int

__all__ = ["CudaSource", "HostLaunch", "Kernel", "LaunchGuard", "launch_maps", "launch_views"]

S = TypeVar("S", bound=np.generic)


@dataclass(frozen=True, slots=True)
class CudaSource:
    """CUDA C++ source of a kernel, compiled with NVRTC.

    Attributes:
        source: The CUDA C++ translation unit.
        entry: Name of the ``extern "C" __global__`` function to launch.
        block: Threads per cube (CUDA block dimensions).
        options: Extra NVRTC options (``-arch`` is chosen for the device).
        shared_mem_bytes: Dynamic shared memory per block.
    """

    source: str
    entry: str
    block: tuple[int, int, int] = (256, 1, 1)
    options: tuple[str, ...] = ()
    shared_mem_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not isinstance(self.entry, str):
            raise InvalidArgument(
                "CudaSource(source, entry): the CUDA C++ source and the name of its "
                f"entry point, both str; got {type(self.source).__name__} and "
                f"{type(self.entry).__name__}"
            )
        block = self.block
        if (
            not isinstance(block, tuple | list)
            or len(block) != 3
            or not all(_is_int(b) and b >= 1 for b in block)
        ):
            raise InvalidArgument(f"block must be three positive ints, got {block!r}")
        object.__setattr__(self, "block", tuple(int(b) for b in block))  # hashable, plain
        if not isinstance(self.options, tuple | list) or not all(
            isinstance(o, str) for o in self.options
        ):
            raise InvalidArgument(f"options must be NVRTC options (str), got {self.options!r}")
        object.__setattr__(self, "options", tuple(self.options))
        shared = self.shared_mem_bytes
        if not _is_int(shared) or shared < 0:
            raise InvalidArgument(f"shared_mem_bytes must be an int >= 0, got {shared!r}")


@dataclass(slots=True)
class HostLaunch:
    """What a host kernel function receives.

    Its views are valid only while the kernel runs: the memory is reused for later
    buffers once the launch is done. A kernel that keeps one (``launch.buffers[0]``, a
    view derived from it, or the launch itself) past its return fails the launch with
    :class:`~asynccube.ExecutionError` naming it; the views it was given turn read-only,
    and the buffers stay reserved until every kept view is gone, so no later buffer
    shares their memory. Copy what must outlive the launch (``np.copy``).

    Attributes:
        buffers: A writable ``uint8`` numpy view of each buffer binding (offsets applied).
        scalars: Scalars by numpy dtype (one array per dtype present).
        metadata: The ``uint32`` metadata array.
        count: The static cube count ``(x, y, z)`` (dynamic counts already read).
        tensor_maps: Tensor maps with a ``uint8`` view of each backing buffer.
    """

    buffers: list[npt.NDArray[np.uint8]]
    scalars: dict[np.dtype[np.generic], npt.NDArray[np.generic]]
    metadata: npt.NDArray[np.uint32]
    count: tuple[int, int, int]
    tensor_maps: list[tuple[TensorMapBinding, npt.NDArray[np.uint8]]] = field(default_factory=list)

    @overload
    def scalar(self, dtype: type[S], index: int = 0) -> S: ...
    @overload
    def scalar(self, dtype: npt.DTypeLike, index: int = 0) -> Any: ...
    def scalar(self, dtype: npt.DTypeLike, index: int = 0) -> Any:
        """The ``index``-th scalar of ``dtype`` (raises KeyError naming what is present).

        Typed as that numpy scalar type: ``launch.scalar(np.float32) * x`` is float32.
        """
        dt = np.dtype(dtype)
        if dt not in self.scalars:
            present = ", ".join(str(d) for d in self.scalars) or "none"
            raise KeyError(f"no {dt} scalars in this launch (present: {present})")
        value: np.generic = self.scalars[dt][index]
        return value


HostFn = Callable[[HostLaunch], None]

_View = npt.NDArray[np.uint8]
_frombuffer = np.frombuffer
_getrefcount = sys.getrefcount
_U8: Final = np.dtype(np.uint8)


def launch_views(views: list[_View]) -> list[_View]:
    """A new ``uint8`` view of each of ``views`` for one launch.

    Each is built over a memoryview, so that numpy makes it the base of every view
    derived from it (``b.view(np.float32)``, ``b[4:]``): whatever the kernel keeps of
    it then holds a reference to it, which :class:`LaunchGuard` counts.
    """
    return [_frombuffer(memoryview(v), _U8) for v in views]  # type: ignore[arg-type]


def launch_maps(
    maps: list[tuple[TensorMapBinding, _View]],
) -> list[tuple[TensorMapBinding, _View]]:
    """Each tensor map with a new view of its buffer for one launch (as
    :func:`launch_views`)."""
    if not maps:
        return []
    return [(t, v) for (t, _), v in zip(maps, launch_views([v for _, v in maps]), strict=True)]


class LaunchGuard:
    """Finds what a host kernel kept of its :class:`HostLaunch` once it returned.

    :meth:`arm`, just before the kernel runs, counts the references to the launch, its
    lists, each view and tensor-map pair; :meth:`check`, after it, counts them again the
    same way. A count that grew means the kernel kept the object (or a view derived from
    it: numpy makes each of these views the base of what is derived from it).
    """

    __slots__ = ("_before", "_handed")

    def __init__(self, launch: HostLaunch) -> None:
        maps = launch.tensor_maps
        if maps:
            self._handed = [launch, launch.buffers, maps, *launch.buffers, *maps]
            self._handed += [view for _, view in maps]
        else:
            self._handed = [launch, launch.buffers, maps, *launch.buffers]
        self._before: list[int] = []

    def arm(self) -> None:
        """Count the references now, just before the kernel runs (a call of its own, so
        that no argument of the constructor's is counted)."""
        self._before = list(map(_getrefcount, self._handed))

    def check(self, kernel_id: str, keep: list[Any]) -> ExecutionError | None:
        """The ExecutionError naming what the kernel kept, if anything (for the caller to
        raise once it holds no view); then the views are read-only and ``keep`` (the
        launch's bindings) lives as long as any kept view, so that their memory is not
        handed to another buffer meanwhile. Either way the guard lets go of the views."""
        handed, after = self._handed, list(map(_getrefcount, self._handed))  # as in arm()
        self._handed = []
        if after == self._before:
            return None
        kept = [
            _name(handed, i)
            for i, (a, b) in enumerate(zip(after, self._before, strict=True))
            if a > b
        ]
        if not kept:
            return None
        _reserve(handed, keep, read_only=True)
        return ExecutionError(
            f"kernel {kernel_id!r} kept {', '.join(dict.fromkeys(kept))} (or a view "
            "derived from it) after it returned; a host kernel's views are valid only "
            "during its launch, their memory is reused for later buffers: copy what must "
            "outlive it (np.copy), or read the buffer with client.read_array after the "
            "launch. Its buffers stay reserved until the kept views are gone"
        )

    def failed(self, keep: list[Any]) -> None:
        """The kernel raised: its traceback may hold views, and so may the kernel, so
        ``keep`` (the launch's bindings) lives as long as any of them does."""
        handed, self._handed = self._handed, []
        _reserve(handed, keep, read_only=False)


def _reserve(handed: list[Any], keep: list[Any], *, read_only: bool) -> None:
    """Keep (a copy of) ``keep`` alive as long as any view in ``handed`` is."""
    keep = list(keep)  # the caller clears its own list
    for obj in handed:
        if isinstance(obj, np.ndarray):
            if read_only:
                obj.flags.writeable = False
            weakref.finalize(obj, _hold, keep).atexit = False


def _name(handed: list[Any], index: int) -> str:
    """How the kernel saw ``handed[index]`` (the order of :class:`LaunchGuard`)."""
    if index < 3:
        return ("the launch", "launch.buffers", "launch.tensor_maps")[index]
    buffers = len(handed[1])
    if index < 3 + buffers:
        return f"launch.buffers[{index - 3}]"
    return f"launch.tensor_maps[{(index - 3 - buffers) % len(handed[2])}]"


def _hold(keep: list[Any]) -> None:
    """A finalizer's callback: its argument (the bindings) lived until now."""


class Kernel:
    """A compute kernel: a stable ``id`` (the compile-cache key) and its per-server parts.

    Args:
        id: Stable, unique name of the kernel; kernels with the same id are assumed
            to be the same computation.
        cuda: The CUDA part, compiled with NVRTC for ``CudaServer``.
        host: A function run by ``HostServer`` with a :class:`HostLaunch`.
    """

    __slots__ = ("cuda", "host", "id")

    def __init__(self, id: str, *, cuda: CudaSource | None = None, host: HostFn | None = None):
        if not isinstance(id, str) or not id:
            raise InvalidArgument("Kernel id must be a non-empty str")
        if cuda is None and host is None:
            raise InvalidArgument(f"kernel {id!r} needs at least a cuda= or a host= part")
        if host is not None and not callable(host):
            raise InvalidArgument(f"kernel {id!r}: host= must be callable")
        self.id = id
        self.cuda = cuda
        self.host = host

    def __repr__(self) -> str:
        parts = [p for p, v in (("cuda", self.cuda), ("host", self.host)) if v is not None]
        return f"Kernel({self.id!r}, parts={parts})"

    def host_part(self, server: str) -> HostFn:
        """The host function, or KernelNotSupported naming the kernel and ``server``."""
        if self.host is None:
            raise KernelNotSupported(
                f"kernel {self.id!r} has no host part, so the {server} server cannot run it; "
                "pass host=... to Kernel(...)"
            )
        return self.host

    def cuda_part(self, server: str) -> CudaSource:
        """The CUDA source, or KernelNotSupported naming the kernel and ``server``."""
        if self.cuda is None:
            raise KernelNotSupported(
                f"kernel {self.id!r} has no CUDA part, so the {server} server cannot run it; "
                "pass cuda=CudaSource(...) to Kernel(...)"
            )
        return self.cuda


def block_size(block: Sequence[int]) -> int:
    """Threads per block."""
    return int(np.prod(block))
