"""What the host and CUDA graph captures share: captured launches, update checks, and
the storage guard that refuses new pages while a capture is open.

A capture swaps a few of its server's instance attributes (``execute``, ``write``, the
memory manager's storage, ...) for recording twins while it is open, and puts them back
when it ends or is aborted: nothing on the launch path pays for graphs when none is
being captured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import GraphCaptureError, GraphUpdateError
from ..memory.storage import StorageHandle
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import Binding, ExecutionMode, Handle

__all__ = [
    "CapturedGraph",
    "CapturedLaunch",
    "NoNewPages",
    "ServerCapture",
    "check_update",
    "guarded_create",
    "refuse_dynamic",
]


@dataclass(slots=True)
class CapturedLaunch:
    """One ``execute`` recorded by a capture, with the bindings it runs with now
    (updates replace them)."""

    kernel: Kernel
    count: CubeCount
    bindings: Bindings
    mode: ExecutionMode

    def all_bindings(self) -> list[Binding]:
        """Every binding the launch touches."""
        return self.bindings.all_bindings()


class CapturedGraph(Protocol):
    """A server's side of a finished capture."""

    launches: list[CapturedLaunch]

    def replay(self, updates: Mapping[int, Bindings], stream: StreamId) -> None:
        """Run the graph on ``stream`` (after applying ``updates`` to its launches)."""
        ...

    def release(self) -> None:
        """Free the graph once the device has passed its last replay (actor only)."""
        ...


class ServerCapture(Protocol):
    """A server's side of a capture in progress."""

    def end(self) -> CapturedGraph:
        """Stop recording; the graph (raises if the capture failed, after cleaning up)."""
        ...

    def abort(self) -> None:
        """Stop recording and drop everything recorded (never raises)."""
        ...


def refuse_dynamic(count: CubeCount) -> None:
    """Raise if ``count`` is read from a buffer (that read cannot be captured)."""
    if count.binding is not None:
        raise GraphCaptureError(
            "execute() with a dynamic CubeCount cannot be captured (its count is read back "
            "to the host first); capture launches with static counts"
        )


class NoNewPages:
    """A storage twin installed as a memory manager's storage while a capture is open:
    it refuses new pages while ``refusing`` (an allocation of the capturing stream) and
    forwards everything else (other streams allocate as usual)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.alignment: int = inner.alignment
        self.max_alloc: int | None = inner.max_alloc
        self.refusing = False

    def alloc(self, size: int) -> StorageHandle:
        """A new page, unless refusing: a new page cannot be recorded into a graph."""
        if not self.refusing:
            page: StorageHandle = self.inner.alloc(size)
            return page
        raise GraphCaptureError(
            f"an allocation that needs a new page ({size} bytes) cannot be captured; "
            "create the buffers before the capture (or free some to be reused)"
        )

    def dealloc(self, storage_id: int) -> None:
        """Forwarded."""
        self.inner.dealloc(storage_id)

    def resource(self, handle: StorageHandle) -> Any:
        """Forwarded."""
        return self.inner.resource(handle)

    def storage_ids(self) -> Iterator[int]:
        """Forwarded."""
        return iter(self.inner.storage_ids())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def guarded_create(server: Any, pages: NoNewPages, slot: int) -> Callable[..., None]:
    """A twin of ``server.create`` under which the capturing slot's allocations may not
    take new pages."""
    create = type(server).create

    def twin(handles: Sequence[Handle], stream: StreamId) -> None:
        if server.stream_slot(stream) != slot:
            create(server, handles, stream)
            return
        pages.refusing = True
        try:
            create(server, handles, stream)
        finally:
            pages.refusing = False

    return twin


def check_update(launches: list[CapturedLaunch], index: object, new: object) -> Bindings:
    """``new`` if it may replace launch ``index``'s bindings, else GraphUpdateError."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(launches):
        raise GraphUpdateError(
            f"update key {index!r} is not a launch of this graph; use 0..{len(launches) - 1} "
            "(the order of the executes in the capture, see graph.launches)"
        )
    if not isinstance(new, Bindings):
        raise GraphUpdateError(f"update {index}: expected Bindings, got {type(new).__name__}")
    old = launches[index].bindings
    where = f"update of launch {index} ({launches[index].kernel.id!r})"
    if old.tensor_maps or new.tensor_maps:
        raise GraphUpdateError(f"{where}: launches with tensor maps cannot be updated")
    if _scalar_shape(old) != _scalar_shape(new) or len(old.metadata) != len(new.metadata):
        raise GraphUpdateError(
            f"{where}: scalars {_scalar_shape(new)} and metadata {len(new.metadata)} words "
            f"must match the captured {_scalar_shape(old)} and {len(old.metadata)} words"
        )
    if len(old.buffers) != len(new.buffers):
        raise GraphUpdateError(
            f"{where}: {len(new.buffers)} buffers given, the launch takes {len(old.buffers)}"
        )
    for i, (a, b) in enumerate(zip(old.buffers, new.buffers, strict=True)):
        if a.size != b.size:
            raise GraphUpdateError(
                f"{where}: buffer {i} has {b.size} bytes, the captured one {a.size}; "
                "updates take buffers of the same sizes (capture another graph otherwise)"
            )
    return new


def _scalar_shape(bindings: Bindings) -> list[tuple[str, int]]:
    return [(s.ty.name, s.length) for s in bindings.ordered_scalars()]
