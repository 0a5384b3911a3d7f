"""Slice handles: the reference-counted token that keeps a slice of memory alive.

A :class:`SliceHandle` is what cubecl calls ``SliceHandle`` (an ``Arc<SliceId>``): every
``Handle`` and ``Binding`` over one slice shares the same object. When the last of them
is gone, CPython's reference counting releases it on whatever thread dropped it, which
appends the slice id to its owner's release queue (``deque.append`` is atomic, so no
lock sits on the launch path). The memory manager drains that queue on its own thread
before it next allocates.

``SliceHandle`` is the compiled token (``_native_slices.c``: the release is part of its
deallocation, no Python call per drop) where that extension imports and
``ASYNCCUBE_NO_EXTENSIONS`` is not set, else its pure-Python twin
:class:`PySliceHandle` (the release in ``__del__``); :data:`TOKEN` says which.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import TYPE_CHECKING, Final

from ..extensions import compiled

__all__ = ["TOKEN", "PySliceHandle", "ReleaseQueue", "SliceHandle"]


class ReleaseQueue:
    """Where dropped slices go until their memory manager takes them back.

    Attributes:
        owner_id: Identifies the memory manager (and so the client) owning the slices.
        closed: Set when the owner is closed: its handles become invalid.
    """

    __slots__ = ("_queue", "closed", "owner_id")

    def __init__(self, owner_id: int) -> None:
        self.owner_id: Final = owner_id
        self.closed = False
        self._queue: deque[int] = deque()

    def push(self, slice_id: int) -> None:
        """Record that ``slice_id`` has no handle left (thread-safe, lock-free)."""
        self._queue.append(slice_id)

    def drain(self) -> list[int]:
        """Take every released slice id recorded so far (owner thread only)."""
        out: list[int] = []
        pop = self._queue.popleft
        while self._queue:
            out.append(pop())
        return out

    def __len__(self) -> int:
        return len(self._queue)


class PySliceHandle:
    """Shared token for one slice; its last reference gone, the slice is released.

    The pure-Python twin of the compiled ``SliceHandle``: the same constructor,
    ``id`` and ``queue``, weak references, ``refcount()`` and release.
    """

    __slots__ = ("__weakref__", "id", "queue")

    def __init__(self, slice_id: int, queue: ReleaseQueue) -> None:
        self.id: Final = slice_id
        self.queue: Final = queue

    def __del__(self) -> None:
        try:
            self.queue._queue.append(self.id)  # push(), inlined: this runs for every handle
        except AttributeError:
            if hasattr(self, "queue") and hasattr(self, "id"):
                raise  # a queue that cannot take it: reported as the compiled token's
            # else __init__ never ran (a bad call): there is no slice to release

    def __repr__(self) -> str:
        return f"SliceHandle(id={self.id}, owner={self.queue.owner_id})"

    def refcount(self) -> int:
        """``sys.getrefcount`` of this token (see ``Handle.can_mut`` for its use)."""
        return sys.getrefcount(self)


def _choose() -> tuple[type[PySliceHandle], str]:
    module, _ = compiled("asynccube._core.values._native_slices")
    if module is None:
        return PySliceHandle, "python"
    token: type[PySliceHandle] = module.SliceHandle
    return token, "native"


_chosen = _choose()
if TYPE_CHECKING:
    SliceHandle = PySliceHandle
else:
    SliceHandle = _chosen[0]
TOKEN: Final[str] = _chosen[1]
"""``"native"`` (the compiled token) or ``"python"`` (:class:`PySliceHandle`)."""
