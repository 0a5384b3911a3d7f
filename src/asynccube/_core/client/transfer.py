"""``client.to_client(handle, other)``: the same bytes in a buffer of another client.

The new handle is minted in ``other`` at once, and a command is queued on each side at
the same moment (so both sides keep the callers' order, and no cycle of waits can form):

* two CUDA clients whose devices reach each other: the source side records an event
  after its work on the buffer; the destination side waits for it on its stream and
  copies with ``cuMemcpyPeerAsync``; the source's stream then waits for the copy, and
  the source buffer is held until it ran (:mod:`.cuda.peer`);
* anything else (host <-> CUDA, host <-> host, devices without peer access): a read on
  the source (into pinned memory on CUDA) and a write of those bytes on the
  destination, which waits for the read without blocking the loop.

A failure (the source read failed, the destination is out of memory) is held for the
calling task's stream on the destination and makes the new handle invalid, naming the
cause.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..channel.backend import shield
from ..errors import InvalidArgument, InvalidHandle
from ..values.stream_id import StreamId
from ..values.types import Binding, Handle

if TYPE_CHECKING:
    from .parts import ClientParts

__all__ = ["to_client"]


def to_client(src: ClientParts, handle: Handle | Binding, other: ClientParts) -> Handle:
    """See :meth:`ComputeClient.to_client`."""
    other._channel.check()  # the caller checked its own channel and ``other``'s type
    if other is src:
        raise InvalidArgument("to_client needs another client; the handle is already on this one")
    binding = _binding(handle)
    if not src.server.owns(binding):  # type: ignore[attr-defined]
        raise InvalidHandle(
            f"{binding!r} does not belong to this {src.device} client (it is another "
            "client's, or a closed one's); call to_client on the client that created it"
        )
    dst = other._memory.mint(binding.size)
    stream = StreamId.current()
    if _peer(src, other):
        _peer_copy(src, binding, other, dst, stream)
    else:
        data = src.read([binding])
        other._channel.send(_write_when_read, other, dst, data, stream)
    return dst


async def _wait(fut: asyncio.Future[Any]) -> None:
    """Wait for ``fut``, set by another client's command; that client's channel fails
    it if its actor dies first (:meth:`.Channel.track`). Shielded: cancelling the waiter
    does not cancel what the other side looks at (on the future's own loop: asyncio's,
    or trio's adapter)."""
    if not fut.done():
        await shield(fut)


def _binding(handle: object) -> Binding:
    if isinstance(handle, Handle):
        return handle.binding()
    if isinstance(handle, Binding):
        return handle
    raise InvalidArgument(f"to_client copies a Handle or Binding, got {type(handle).__name__}")


def _peer(src: ClientParts, dst: ClientParts) -> bool:
    if src.server.properties.kind != "cuda" or dst.server.properties.kind != "cuda":
        return False
    from ..cuda.peer import can_copy

    return can_copy(src.server, dst.server)


def _fail(client: ClientParts, dst: Handle, stream: StreamId, exc: BaseException) -> None:
    client.server.fail_handle(dst, exc)  # type: ignore[attr-defined]
    client._channel.hold(stream, exc)


def _write_when_read(
    other: ClientParts, dst: Handle, data: asyncio.Future[list[Any]], stream: StreamId
) -> Any:
    if data.done():
        return _write(other, dst, data, stream)
    return _after_read(other, dst, data, stream)


async def _after_read(
    other: ClientParts, dst: Handle, data: asyncio.Future[list[Any]], stream: StreamId
) -> None:
    await other._channel.backend.wait(data)  # a request future: a dead channel fails it
    other._channel.activate()
    pending = _write(other, dst, data, stream)
    if pending is not None:
        await pending


def _write(
    other: ClientParts, dst: Handle, data: asyncio.Future[list[Any]], stream: StreamId
) -> Any:
    exc = data.exception()
    if exc is not None:
        _fail(other, dst, stream, exc)
        return None
    return other._movement.create_with_data(stream, dst, data.result()[0])


def _peer_copy(
    src: ClientParts, binding: Binding, other: ClientParts, dst: Handle, stream: StreamId
) -> None:
    """Three commands, sent at once: export on the source, import and copy on the
    destination, finish on the source. When both actors are idle (the usual case) all
    three run inline in the caller, so the copy is on the device before this returns;
    otherwise each side waits for the other's future without blocking its loop."""
    loop = src.loop
    ready: asyncio.Future[Any] = loop.create_future()
    copied: asyncio.Future[Any] = loop.create_future()
    src._channel.track(ready)
    other._channel.track(copied)
    src._channel.send(_source_side, src, binding, ready, stream)
    other._channel.send(_dest_side, src, other, dst, ready, copied, stream)
    src._channel.send(_source_finish, src, other, binding, ready, copied)


def _source_side(
    src: ClientParts, binding: Binding, ready: asyncio.Future[Any], stream: StreamId
) -> None:
    from ..cuda import peer

    try:
        source = peer.export(src.server, binding, stream)  # type: ignore[arg-type]
    except BaseException as exc:
        ready.set_exception(exc)
        ready.exception()  # retrieved: the destination side looks at it
        src._channel.hold(stream, exc)
        return
    ready.set_result(source)


def _source_finish(
    src: ClientParts,
    other: ClientParts,
    binding: Binding,
    ready: asyncio.Future[Any],
    copied: asyncio.Future[Any],
) -> Any:
    if ready.exception() is not None:
        return None  # the export failed: no event to give back, nothing copied
    if not copied.done():
        return _source_done(src, other, binding, ready.result(), copied)
    _finish(src, other, binding, ready.result(), copied)
    return None


async def _source_done(
    src: ClientParts, other: ClientParts, binding: Binding, source: Any, copied: asyncio.Future[Any]
) -> None:
    await _wait(copied)
    src._channel.activate()
    _finish(src, other, binding, source, copied)


def _finish(
    src: ClientParts, other: ClientParts, binding: Binding, source: Any, copied: asyncio.Future[Any]
) -> None:
    from ..cuda import peer

    if copied.exception() is not None:
        peer.abandon(src.server, source)  # type: ignore[arg-type]
        return
    peer.finish(src.server, other.server, source, copied.result(), binding)  # type: ignore[arg-type]


def _dest_side(
    src: ClientParts,
    other: ClientParts,
    dst: Handle,
    ready: asyncio.Future[Any],
    copied: asyncio.Future[Any],
    stream: StreamId,
) -> Any:
    from ..cuda import peer

    if ready.done() and peer.enable_peer_job(src.server, other.server) is None:  # type: ignore[arg-type]
        _import(other, dst, ready, copied, stream)
        return None
    return _dest_side_later(src, other, dst, ready, copied, stream)


async def _dest_side_later(
    src: ClientParts,
    other: ClientParts,
    dst: Handle,
    ready: asyncio.Future[Any],
    copied: asyncio.Future[Any],
    stream: StreamId,
) -> None:
    from ..cuda import peer

    try:
        await _wait(ready)
        if ready.exception() is None:
            job = peer.enable_peer_job(src.server, other.server)  # type: ignore[arg-type]
            if job is not None:
                await other._jobs.run(job)
    except BaseException as exc:
        _give_up(other, dst, copied, stream, exc)
        if isinstance(exc, other._channel.backend.cancelled):
            raise  # the actor is being cancelled: the copy failed, and the actor ends
        return
    other._channel.activate()
    _import(other, dst, ready, copied, stream)


def _import(
    other: ClientParts,
    dst: Handle,
    ready: asyncio.Future[Any],
    copied: asyncio.Future[Any],
    stream: StreamId,
) -> None:
    from ..cuda import peer

    try:
        source = ready.result()
        copied.set_result(peer.import_copy(other.server, dst, source, stream))  # type: ignore[arg-type]
    except BaseException as exc:
        _give_up(other, dst, copied, stream, exc)


def _give_up(
    other: ClientParts,
    dst: Handle,
    copied: asyncio.Future[Any],
    stream: StreamId,
    exc: BaseException,
) -> None:
    if not copied.done():
        copied.set_exception(exc)
        copied.exception()  # retrieved: the source side only looks at it
    _fail(other, dst, stream, exc)
