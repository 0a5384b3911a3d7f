"""Graphs on the host server: a capture records the command list, a replay runs it.

While a capture is open on a stream slot, the server's ``execute`` and ``write`` record
what that slot's task issues instead of running it (other slots run as usual), and its
memory manager refuses new pages, exactly as a CUDA stream capture would. Replaying
issues the recorded commands again, in order, on the replaying task's stream, each
launch with its current bindings (updates replace them), so the same program runs on
both servers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..server.capture import CapturedLaunch, NoNewPages, guarded_create, refuse_dynamic
from ..server.host_copies import dense, source_nbytes
from ..server.layout import check_copy
from ..server.protocol import BytesLike
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import CopyDescriptor, ExecutionMode

if TYPE_CHECKING:
    from .server import HostServer

__all__ = ["HostCapture", "HostGraph"]

_Write = tuple[list[tuple[CopyDescriptor, BytesLike]]]


class HostGraph:
    """A recorded command list (see the module docstring)."""

    def __init__(self, server: HostServer, commands: list[CapturedLaunch | _Write]) -> None:
        self._server = server
        self._commands = commands
        self.launches = [c for c in commands if isinstance(c, CapturedLaunch)]

    def replay(self, updates: Mapping[int, Bindings], stream: StreamId) -> None:
        """Issue every recorded command on ``stream``; updates stay in effect."""
        for index, bindings in updates.items():
            self.launches[index].bindings = bindings
        server, cls = self._server, type(self._server)
        for command in self._commands:
            if isinstance(command, CapturedLaunch):
                c = command
                cls.execute(server, c.kernel, c.count, c.bindings, c.mode, stream)
            else:
                cls.write(server, command[0], stream)

    def release(self) -> None:
        """Drop the commands (and so their bindings)."""
        self._commands = []
        self.launches = []


class HostCapture:
    """Records the commands of one stream slot of a :class:`HostServer`."""

    def __init__(self, server: HostServer, stream: StreamId) -> None:
        self._server = server
        self._slot = server.stream_slot(stream)
        self._commands: list[CapturedLaunch | _Write] = []
        memory = server.memory
        self._storage = memory.storage
        pages = memory.storage = NoNewPages(self._storage)
        server.create = guarded_create(server, pages, self._slot)  # type: ignore[method-assign]
        server.execute = self._execute  # type: ignore[method-assign]
        server.write = self._write  # type: ignore[method-assign]

    def _mine(self, stream: StreamId) -> bool:
        return self._server.stream_slot(stream) == self._slot

    def _execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        server = self._server
        if not self._mine(stream):
            type(server).execute(server, kernel, count, bindings, mode, stream)
            return
        refuse_dynamic(count)
        kernel.host_part("host")  # a kernel without a host part fails now, not at replay
        for binding in bindings.all_bindings():
            server.check_binding(binding)
        self._commands.append(CapturedLaunch(kernel, count, bindings, mode))

    def _write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        server = self._server
        if not self._mine(stream):
            type(server).write(server, items, stream)
            return
        kept: list[tuple[CopyDescriptor, BytesLike]] = []
        for desc, item in items:
            data: Any = item  # bytes-like, or an array borrowed by ``snapshot``
            check_copy(desc, source_nbytes(data))
            server.check_binding(desc.binding)
            # A borrowed array (large data, see .copies) is copied now: a replay writes
            # what the data was when it was captured, as for small data.
            kept.append((desc, dense(data).tobytes() if isinstance(data, np.ndarray) else data))
        self._commands.append((kept,))

    def _restore(self) -> None:
        server: Any = self._server
        del server.execute, server.write, server.create
        server.memory.storage = self._storage

    def end(self) -> HostGraph:
        """Stop recording; the recorded graph."""
        self._restore()
        return HostGraph(self._server, self._commands)

    def abort(self) -> None:
        """Stop recording and drop the commands."""
        self._restore()
        self._commands = []
