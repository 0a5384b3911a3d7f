"""The ComputeServer protocol (cubecl's ``ComputeServer`` trait).

A server is plain synchronous code driven by one actor task: it never awaits and never
blocks the event loop. Work that finishes later (``read``, ``sync``, ``get_resource``,
``end_profile``) comes back as a :class:`Completion`, which the channel turns into an
awaitable without blocking the loop. Errors in fire-and-forget work (``execute``,
``write``) are raised synchronously when they can be detected at once, or held by the
server and raised by the next completion on the same stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..config.pools import MemoryLayout
from ..memory.management import MemoryReport
from ..profiling.records import KernelRecord
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import (
    Allocation,
    AllocationDescriptor,
    Binding,
    CopyDescriptor,
    ExecutionMode,
    Handle,
    MemoryAllocationMode,
    MemoryUsage,
    ProfileDuration,
    ProfilingToken,
)
from .foreign import ForeignWork

__all__ = [
    "BindingResource",
    "BytesLike",
    "Completion",
    "ComputeServer",
    "DeviceProperties",
    "OffLoop",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")

BytesLike = bytes | bytearray | memoryview


@runtime_checkable
class Completion(Protocol[T_co]):
    """Work the server has queued and that finishes later.

    ``done`` and ``result`` never block; ``wait`` blocks and is only ever called from a
    helper thread, never from the event loop.
    """

    def done(self) -> bool:
        """True once the result (or error) is available."""
        ...

    def result(self) -> T_co:
        """The result, or raise the work's typed error. Only valid once ``done()``."""
        ...

    def wait(self, timeout: float | None) -> bool:
        """Block up to ``timeout`` seconds (forever if None); True if done."""
        ...


@dataclass(frozen=True, slots=True)
class OffLoop(Generic[T]):
    """A completion's result that is not ready to hand over yet: ``work()`` must run
    first, in a worker thread (a copy of milliseconds the loop must not wait for), then
    ``finish()`` on the loop gives the value (or raises). The channel does both before
    it settles the command's future; ``finish`` runs even where ``work`` raised (it
    releases what ``work`` used), and the first error is the command's."""

    work: Callable[[], object]
    finish: Callable[[], T]


@dataclass(frozen=True, slots=True)
class BindingResource(Generic[R]):
    """The storage behind a binding: the resource (a numpy view, a device pointer),
    and the offset and size of the binding within it."""

    resource: R
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class DeviceProperties:
    """What a server's device is and what it can do.

    Attributes:
        name: Human-readable device name.
        kind: ``"host"`` or ``"cuda"``.
        alignment: Allocation alignment in bytes.
        max_allocation: The largest single allocation, in bytes.
        extra: Server-specific properties (compute capability, SM count, ...).
    """

    name: str
    kind: str
    alignment: int
    max_allocation: int
    extra: dict[str, Any] = field(default_factory=dict)


class ComputeServer(Protocol):
    """Owns resources and runs computations on them; accessed only by the actor."""

    @property
    def device(self) -> str:
        """The device string, e.g. ``"host"`` or ``"cuda:0"``."""
        ...

    @property
    def properties(self) -> DeviceProperties:
        """The device's properties."""
        ...

    def layout(self, descriptor: AllocationDescriptor) -> tuple[int, tuple[int, ...]]:
        """Bytes to reserve and strides (in elements) for ``descriptor`` (pure, any thread).

        OPTIMIZED descriptors get pitched rows on servers that pad them.
        """
        ...

    def new_handle(self, size: int, stream: StreamId) -> Handle:
        """Mint a handle of ``size`` bytes; memory is bound by a later ``create``.

        Called by the client on the loop thread; touches no server state but a counter.
        """
        ...

    def create(self, handles: Sequence[Handle], stream: StreamId) -> None:
        """Reserve memory for each minted handle (cubecl's ``create``).

        A failed reservation raises (BufferTooBig, OutOfMemory) and leaves the handle
        invalid; later uses of it raise InvalidHandle naming the cause.
        """
        ...

    def allocate(
        self, descriptors: Sequence[AllocationDescriptor], stream: StreamId
    ) -> list[Allocation]:
        """cubecl's ``create`` with allocation descriptors: mint, reserve, and return
        each handle with its strides."""
        ...

    def staging(self, sizes: Sequence[int], stream: StreamId) -> list[memoryview]:
        """Host buffers of ``sizes`` bytes, fast to copy from (pinned on CUDA)."""
        ...

    def create_with_data(self, handle: Handle, data: BytesLike, stream: StreamId) -> None:
        """Reserve a minted contiguous handle and copy ``data`` into it."""
        ...

    def read(
        self, descriptors: Sequence[CopyDescriptor], stream: StreamId
    ) -> Completion[list[bytes]]:
        """Copy each (possibly strided) tensor out, densely packed, as bytes."""
        ...

    def read_into(
        self, descriptors: Sequence[CopyDescriptor], outs: Sequence[memoryview], stream: StreamId
    ) -> Completion[None]:
        """Copy each (possibly strided) tensor out, densely packed, into its writable
        byte buffer in ``outs`` (checked to hold exactly the tensor's bytes)."""
        ...

    def write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        """Copy dense bytes into each (possibly strided) tensor, in stream order."""
        ...

    def sync(self, stream: StreamId) -> Completion[None]:
        """Completes when all work queued so far, on every stream, is done."""
        ...

    def get_resource(self, binding: Binding, stream: StreamId) -> Completion[BindingResource[Any]]:
        """The storage resource behind ``binding``, once the stream's work is done."""
        ...

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """Queue ``kernel`` over ``bindings`` on ``stream``."""
        ...

    def flush(self, stream: StreamId) -> None:
        """Submit any work buffered for ``stream``."""
        ...

    def end_batch(self) -> None:
        """Submit everything buffered while the actor ran a batch of commands.

        The actor calls it whenever it yields to the loop, so buffered work never waits
        for a later command.
        """
        ...

    def memory_usage(self, stream: StreamId) -> MemoryUsage:
        """Current memory usage."""
        ...

    def memory_report(self, stream: StreamId) -> MemoryReport:
        """Usage, pages and peaks of each memory pool."""
        ...

    def kernel_records(self, stream: StreamId) -> list[KernelRecord]:
        """Kernels, copies and waits recorded so far (profiling level medium or full)."""
        ...

    def memory_cleanup(self, stream: StreamId) -> None:
        """Release memory that nothing uses."""
        ...

    def start_profile(self, stream: StreamId) -> ProfilingToken:
        """Start a profile; profiles may nest and overlap."""
        ...

    def end_profile(self, stream: StreamId, token: ProfilingToken) -> Completion[ProfileDuration]:
        """End the profile ``token``; the completion gives its duration."""
        ...

    def allocation_mode(self, mode: MemoryAllocationMode, stream: StreamId) -> None:
        """Switch which pools new allocations come from."""
        ...

    def capture_foreign(self, work: ForeignWork) -> None:
        """Check ``work`` (another library's stream or event) and capture the work queued
        on it so far (``work.captured``), or raise ForeignStreamError (another device or
        context, unknown to the driver, no GPU). Called by the client at the call, on
        the loop thread, before the command is sent."""
        ...

    def foreign_wait(self, work: ForeignWork, stream: StreamId) -> Completion[None]:
        """Completes once the work ``work`` captured is done (``client.wait``);
        asynccube's own streams are not involved."""
        ...

    def foreign_after(self, work: ForeignWork, stream: StreamId) -> None:
        """Make ``stream`` wait, on the device, for the work ``work`` captured
        (``client.after``): what the task queues next runs after it."""
        ...

    def set_memory_layout(self, layout: MemoryLayout, stream: StreamId) -> None:
        """Empty the pools, return their pages, and use ``layout``'s pools from now on;
        ``MemoryInUse`` while buffers are alive."""
        ...

    def close(self) -> Completion[None]:
        """Finish all queued work and release every resource."""
        ...
