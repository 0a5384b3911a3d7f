"""DryRunServer: the host server in a mode that runs nothing and maps no memory.

A dry run records launches without running them, and reserves memory without mapping
it: every allocation goes through the configured pools as in a real run (same routing,
same pages, the alignment of the device it stands for) over a storage that only counts
(:class:`~..memory.storage.DryStorage`), and the manager measures the peaks of each
size class (:class:`~..memory.measure.MeasuredMemory`). Its ``memory_report()`` feeds
``MemoryReport.plan()``: a layout sized for the real run.

What each command does here:

- launches are checked as the real server would (the kernel has the part the device
  needs, the bindings are live, a checked launch is within the limits) and recorded (a
  ``KernelRecord`` of kind ``"kernel"`` and no duration; ``client.timeline()``), not run;
- writes are checked (sizes, live buffers) and dropped;
- reads complete in stream order with zeros of the right size; ``get_resource`` gives a
  read-only view of zeros;
- syncs, profiles, streams and the release of dropped buffers work as on the host
  server.

The properties are those of the device it stands for, named ``"<name> (dry run)"``
(so the tuner's results, namespaced by that name, never reach a real client).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..config.schema import ProfilingLevel
from ..memory import MemoryConfig, MemoryManagement
from ..memory.measure import MeasuredMemory
from ..memory.storage import DryStorage
from ..profiling.records import KernelRecorder
from ..server.host_copies import source_nbytes
from ..server.launch_limits import HOST_LIMITS, check_launch
from ..server.layout import check_copy
from ..server.protocol import BytesLike, DeviceProperties
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import CopyDescriptor, ExecutionMode
from .kernels import kernel_task
from .server import HostServer, View
from .worker import HostCompletion

__all__ = ["DryRunServer"]

T = TypeVar("T")


class DryRunServer(HostServer):
    """The server of ``open_client(device, dry_run=True)``. See the module docstring.

    Args:
        target: The properties of the device the dry run stands for (``None``: the host).
        alignment: That device's storage alignment (64 host, 512 CUDA).
        **options: As :class:`HostServer` (``memory``, ``max_streams``, ``logger``,
            ``recorder``).
    """

    dry_run = True
    """True: this server runs nothing and maps no memory."""

    def __init__(
        self, *, target: DeviceProperties | None = None, alignment: int = 64, **options: Any
    ) -> None:
        self._target = target
        self._alignment = alignment
        recorder = options.get("recorder")
        if recorder is None or not recorder.enabled:  # launches are always recorded
            options["recorder"] = KernelRecorder(ProfilingLevel.MEDIUM)
        super().__init__(**options)
        base = target if target is not None else self._properties
        self._properties = DeviceProperties(
            name=f"{base.name} (dry run)",
            kind="host",
            alignment=base.alignment,
            max_allocation=self._memory.max_allocation,
            extra={**base.extra, "dry_run": True, "stands_for": base.kind},
        )

    @property
    def device(self) -> str:
        """``"host (dry run)"``, or ``"cuda (dry run)"``: what the dry run stands for."""
        kind = "host" if self._target is None else self._target.kind
        return f"{kind} (dry run)"

    def _manager(self, memory: MemoryConfig) -> MemoryManagement[View]:
        limit = None if self._target is None else self._target.max_allocation
        cuda = self._target is not None and self._target.kind == "cuda"
        storage = DryStorage(self._alignment, limit, ranges=cuda)  # CUDA's virtual memory
        return MeasuredMemory(storage, memory, owner_id=self._table.queue.owner_id)

    # -- what runs nothing ------------------------------------------------------------

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """Check the launch as the real server would and record it; nothing runs."""
        self.warm_up_launch(kernel, count, bindings, mode, stream)
        now = time.perf_counter_ns()
        self.recorder.record(kernel.id, stream.value, "kernel", now, now, now)

    def warm_up_launch(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """Check the launch as the real server would (a warm-up scope's, or
        :meth:`execute`'s); nothing to prepare."""
        if self._target is None:
            kernel_task(kernel, count, bindings, mode, self._view)  # checks, never run
        else:
            kernel.cuda_part(self._target.kind)
            for binding in (*bindings.buffers, *(t.binding for t in bindings.tensor_maps)):
                self._view(binding)
            if mode is ExecutionMode.CHECKED and count.binding is None:
                dims = (count.x, count.y, count.z)
                check_launch(kernel.id, "cuda", dims, HOST_LIMITS, kernel.cuda)

    def write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        """Check each copy (sizes, live buffers); nothing is written."""
        for desc, data in items:
            src: Any = data  # bytes-like, or an array borrowed by ``snapshot``
            if not isinstance(src, np.ndarray):
                src = memoryview(src).cast("B")
            check_copy(desc, source_nbytes(src))
            self._view(desc.binding)

    def read(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> HostCompletion[list[bytes]]:
        """Zeros of each tensor's size, in stream order."""
        return self._zeros(descriptors, stream, bytes)

    def read_arrays(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> HostCompletion[list[npt.NDArray[np.uint8]]]:
        """Zeros of each tensor's size, in new arrays, in stream order."""
        return self._zeros(descriptors, stream, lambda n: np.zeros(n, np.uint8))

    def _zeros(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId, make: Callable[[int], T]
    ) -> HostCompletion[list[T]]:
        for desc in descriptors:
            check_copy(desc)
            self._view(desc.binding)
        sizes = [d.nbytes for d in descriptors]
        resolved = self._streams.resolve(stream, (d.binding for d in descriptors))
        return self._complete_on(resolved.stream, lambda: [make(n) for n in sizes])
