"""Graphs: ``async with client.capture() as graph:`` records a task's commands once;
``graph.replay()`` runs them again, fire-and-forget, ordered like an execute.

The capture belongs to the task that opened it and to its stream slot. Inside it,
``execute``, ``write``, ``create``/``empty`` (from memory the pools already hold) and
``flush`` are recorded; anything that waits for the device or returns data (``read``,
``sync``, ``get_resource``, profiles, ``to_client``, a nested capture, a replay) raises
:class:`GraphCaptureError` naming it, and the capture ends at once, dropping what it
recorded. Another task issuing commands on the captured slot gets the same error (a
capture cannot span tasks). The server does the recording: stream capture on CUDA
(:mod:`.cuda.graph`), a command list on the host (:mod:`.host.graph`).
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..channel.channel import Channel, State
from ..errors import GraphCaptureError, InvalidHandle
from ..server.capture import CapturedGraph, ServerCapture, check_update
from ..values.bindings import Bindings
from ..values.stream_id import StreamId, current_task
from .launch import written_by

if TYPE_CHECKING:
    from ..server.protocol import ComputeServer
    from .parts import ClientParts

__all__ = ["Graph", "capture", "release_graphs"]

CAPTURABLE: Final = frozenset(
    {
        "allocation_mode",
        "create",
        "create_tensors",
        "empty",
        "empty_tensors",
        "execute",
        "flush",
        "memory_cleanup",
        "write",
    }
)
"""Client methods that a capture records; any other call inside a capture raises."""


@dataclass(slots=True)
class _Capture:
    task: object | None  # an asyncio or trio task
    stream: StreamId
    server: ServerCapture | None = None
    aborted: str | None = None


@dataclass(slots=True)
class _Registry:
    """A client's captures in progress (by stream slot) and live graphs."""

    client: ClientParts
    captures: dict[int, _Capture] = field(default_factory=dict)
    graphs: dict[int, CapturedGraph] = field(default_factory=dict)
    dead: deque[int] = field(default_factory=deque)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def slot(self, stream: StreamId) -> int:
        return self.client.server.stream_slot(stream)  # type: ignore[attr-defined,no-any-return]

    def guard(self, op: str) -> None:
        """The channel's check while a capture is open (``op``: the client method)."""
        cap = self.captures.get(self.slot(StreamId.current()))
        if cap is None:
            return
        if cap.task is not _task():
            raise GraphCaptureError(
                f"{op}() runs on a stream slot another task is capturing; a capture belongs "
                "to the task that opened it (call it from that task, or after the capture)"
            )
        if cap.aborted is not None:
            raise GraphCaptureError(
                f"{op}(): the capture was ended by {cap.aborted}(); leave the "
                "`async with client.capture()` block"
            )
        if op in CAPTURABLE:
            return
        cap.aborted = op
        channel = self.client._channel
        channel.send(channel.fire, cap.stream, lambda stream: _abort(cap))
        name = op if " " in op else f"{op}()"
        raise GraphCaptureError(
            f"{name} cannot be captured into a graph (it waits for the device or returns "
            "data); the capture has ended and its graph is dropped. Call it before or "
            "after the capture."
        )

    def drain(self) -> None:
        """Release the graphs whose Graph object is gone (loop thread)."""
        channel = self.client._channel
        while self.dead:
            graph = self.graphs.pop(self.dead.popleft(), None)
            if graph is not None and not self.client.closed:
                channel.send(channel.fire, StreamId.current(), _releaser(graph))


def _task() -> object | None:
    return current_task()


def _abort(cap: _Capture) -> None:
    if cap.server is not None:
        server, cap.server = cap.server, None
        server.abort()


def _releaser(graph: CapturedGraph) -> Any:
    return lambda stream: graph.release()


def _registry(client: ClientParts) -> _Registry:
    reg: _Registry | None = client._graph_registry
    if reg is None:
        reg = client._graph_registry = _Registry(client)
    return reg


def _server_capture(server: ComputeServer, stream: StreamId) -> ServerCapture:
    from ..host.server import HostServer

    if isinstance(server, HostServer):
        from ..host.graph import HostCapture

        return HostCapture(server, stream)
    if server.properties.kind == "cuda":
        from ..cuda.graph import CudaCapture

        return CudaCapture(server, stream)  # type: ignore[arg-type]
    raise GraphCaptureError(f"the {server.device} server does not support graphs")


class Graph:
    """Commands recorded by :meth:`ComputeClient.capture`; :meth:`replay` runs them.

    The graph keeps every buffer it uses alive for as long as it exists. It belongs to
    the client that captured it and may be replayed from any task of that client.
    """

    def __init__(self, client: ClientParts, key: int) -> None:
        self._client = client
        self._key = key
        self._graph: CapturedGraph | None = None
        reg = _registry(client)
        weakref.finalize(self, _forget, reg, key, client.loop)

    def __repr__(self) -> str:
        state = "captured" if self._graph is not None else "not captured"
        return f"Graph({state}, launches={len(self.kernels)})"

    @property
    def kernels(self) -> list[str]:
        """The kernel id of each captured launch, in capture order (the indices of
        ``replay``'s updates)."""
        return [launch.kernel.id for launch in self._graph.launches] if self._graph else []

    def replay(self, updates: Mapping[int, Bindings] | None = None) -> None:
        """Run the captured commands again on the calling task's stream
        (fire-and-forget, ordered like an ``execute``).

        ``updates`` maps a launch index to new ``Bindings`` for it: other buffers of
        the same sizes, other scalar values, same signature (kernel-node parameter
        updates on CUDA). They stay in effect for later replays.
        """
        channel = self._client._channel
        channel.check()
        graph = self._graph
        if graph is None:
            raise GraphCaptureError("this graph holds nothing: its capture did not finish")
        checked = {i: check_update(graph.launches, i, b) for i, b in (updates or {}).items()}
        server = self._client.server
        for bindings in checked.values():
            for binding in bindings.buffers:
                if not server.owns(binding):  # type: ignore[attr-defined]
                    raise InvalidHandle(
                        f"{binding!r} in a graph update belongs to another client; use "
                        "buffers of the client that captured the graph"
                    )
        channel.send(_replay, channel, graph, checked, StreamId.current())


def _replay(
    channel: Channel, graph: CapturedGraph, updates: Mapping[int, Bindings], stream: StreamId
) -> None:
    """The actor's half of :meth:`Graph.replay`: the replay is one command writing every
    buffer its launches bind. On a server whose failures are known when a command is
    issued (CUDA: one graph launch), it is skipped whole when one of them carries a
    failure (see :func:`_skip_graph`); a failed replay taints them, an issued one clears
    them. The host server's workers decide launch by launch, as for ``execute``."""
    bindings = [updates.get(i, launch.bindings) for i, launch in enumerate(graph.launches)]
    if channel._clears_at_call and channel._held._tainted and _skip_graph(channel, graph, bindings):
        return
    written = [b for launch_bindings in bindings for b in written_by(launch_bindings)]
    channel.fire_writing(stream, written, graph.replay, updates)


def _skip_graph(channel: Channel, graph: CapturedGraph, bindings: list[Bindings]) -> bool:
    """Whether a replay is skipped: a buffer one of its launches binds carries a failure.
    Then each launch, in order, gives the buffers it binds the failure with a skip record
    of its own (as a skipped launch does), a launch that binds no carrier naming
    the replay's first carrier: the graph runs as one, so none of its launches ran."""
    held = channel._held
    tainted = held._tainted
    bound = [[b.memory.id for b in written_by(bs)] for bs in bindings]
    for launch, ids in zip(graph.launches, bound, strict=True):
        if launch.count.binding is not None:
            ids.append(launch.count.binding.memory.id)
    first = next((mid for ids in bound for mid in ids if mid in tainted), None)
    if first is None:
        return False
    for launch, ids, bs in zip(graph.launches, bound, bindings, strict=True):
        written = [b.memory.id for b in written_by(bs)]
        if not held.skip(launch.kernel.id, ids, written):
            held.skip(launch.kernel.id, [first, *ids], written)
    return True


def _forget(reg: _Registry, key: int, loop: asyncio.AbstractEventLoop) -> None:
    reg.dead.append(key)
    try:
        loop.call_soon_threadsafe(reg.drain)
    except RuntimeError:  # the loop is closed: the client is gone with it
        pass


@asynccontextmanager
async def capture(client: ClientParts) -> AsyncIterator[Graph]:
    """See :meth:`ComputeClient.capture`."""
    channel = client._channel
    channel.check()
    reg = _registry(client)
    stream = StreamId.current()
    slot = reg.slot(stream)
    cap = _Capture(_task(), stream)
    if not reg.captures:
        channel.add_guard(reg.guard)
    reg.captures[slot] = cap
    key = next(reg.ids)
    graph = Graph(client, key)
    try:
        await channel.request(_begin, client, cap)
        try:
            yield graph
        except BaseException:
            if cap.aborted is None:
                cap.aborted = "an exception"
                channel.send(channel.fire, stream, lambda stream: _abort(cap))
            raise
        if cap.aborted is not None:
            raise GraphCaptureError(f"the capture was ended by {cap.aborted}()")
        if channel.state is not State.OPEN:  # died inside the block: nothing would answer
            raise channel.unusable()
        graph._graph = reg.graphs[key] = await channel.request(_end, client, cap)
    finally:
        del reg.captures[slot]
        if not reg.captures:
            channel.remove_guard(reg.guard)


def _begin(client: ClientParts, cap: _Capture, fut: asyncio.Future[None]) -> None:
    client._channel.settled(fut)  # settled here, below
    held = client._channel.take_held(cap.stream)
    try:
        if held is not None:
            raise held
        cap.server = _server_capture(client.server, cap.stream)
    except BaseException as exc:
        cap.aborted = "its start"
        fut.set_exception(exc)
        return
    fut.set_result(None)


def _end(client: ClientParts, cap: _Capture, fut: asyncio.Future[CapturedGraph]) -> None:
    client._channel.settled(fut)  # settled here, below
    server, cap.server = cap.server, None
    assert server is not None
    held = client._channel.take_held(cap.stream)
    try:
        if held is not None:
            server.abort()
            held.add_note("the capture failed on it, and its graph was dropped")
            raise held
        graph = server.end()
    except BaseException as exc:
        if not fut.done():
            fut.set_exception(exc)
        return
    if fut.done():  # the client died meanwhile
        graph.release()
    else:
        fut.set_result(graph)


def release_graphs(client: ClientParts) -> None:
    """Release every graph of ``client`` (before it closes)."""
    reg: _Registry | None = getattr(client, "_graph_registry", None)
    if reg is None:
        return
    for cap in reg.captures.values():
        if cap.aborted is None:
            cap.aborted = "close"
            channel = client._channel
            channel.send(channel.fire, cap.stream, lambda stream, cap=cap: _abort(cap))
    graphs = list(reg.graphs.values())
    reg.graphs.clear()
    channel = client._channel
    for graph in graphs:
        channel.send(channel.fire, StreamId.current(), _releaser(graph))
