"""Kernels: a stable id plus one part per server (CUDA source, host function)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from .bindings import TensorMapBinding
from .errors import InvalidArgument, KernelNotSupported

__all__ = ["CudaSource", "HostLaunch", "Kernel"]

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
        if len(self.block) != 3 or any(int(b) < 1 for b in self.block):
            raise InvalidArgument(f"block must be three positive ints, got {self.block!r}")
        if self.shared_mem_bytes < 0:
            raise InvalidArgument("shared_mem_bytes must be >= 0")


@dataclass(slots=True)
class HostLaunch:
    """What a host kernel function receives.

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
