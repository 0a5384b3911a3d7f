"""``client.to_client(handle, other)``: the same bytes in a buffer of another client.

The new handle is minted in ``other`` at once, and the copy is ordered on both sides at
the moment of the call (so both sides keep the callers' order, and no cycle of waits can
form):

* two CUDA clients whose devices reach each other: the source side records an event
  after its work on the buffer; the destination side waits for it on its stream and
  copies with ``cuMemcpyPeerAsync``; the source's stream then waits for the copy, and
  the source buffer is held until it ran (:mod:`.cuda.peer`). When both actors are idle
  (the usual case) the caller does all three at once; else a command is queued on each
  channel, and the first to run takes the other's from the head of its queue
  (``Channel.claim``) and does all three, so neither actor waits for the other; only
  when the other's command is not at its queue's head yet does one side wait for it,
  without blocking the loop;
* anything else (host <-> CUDA, host <-> host, devices without peer access): a read on
  the source (into pinned memory on CUDA) and a write of those bytes on the
  destination, which waits for the read without blocking the loop.

A failure (the source read failed, the destination is out of memory, the peer copy
failed) is held for the calling task's stream on the destination and makes the new
handle invalid, naming the cause (a peer copy's handle carries it: each use raises it).
"""

from __future__ import annotations

import asyncio
import copy as copy_module
import weakref
from typing import TYPE_CHECKING, Any

from ..channel.backend import shield
from ..channel.closing import State
from ..errors import ClientClosedError, InvalidArgument, InvalidHandle
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
    if not src._server.owns(binding):  # type: ignore[attr-defined]
        raise InvalidHandle(
            f"{binding!r} does not belong to this {src.device} client (it is another "
            "client's, or a closed one's); call to_client on the client that created it"
        )
    stream = StreamId.current()
    route = _route(src, other)
    if route is _STAGED:
        dst = other._memory.mint(binding.size, stream)
        data = src.read([binding])
        other._channel.send(_write_when_read, other, dst, data, stream)
        return dst
    peer = _peer_module()
    fast = other._fast  # FastLaunch.empty: a dropped slice the stream passed, in one call
    # (only with the destination's context current: else it declines, and the copy
    # switches to it once, for the allocation with the import)
    taken = (
        fast.empty(binding.size) if fast is not None and peer.is_current(other._server) else None
    )
    dst = other._memory.mint(binding.size, stream) if taken is None else taken
    created = taken is not None
    sch, och = src._channel, other._channel
    if route is _READY and sch.can_run_now() and och.can_run_now():
        sch.send(_inline, src, binding, other, dst, stream, created)  # the usual case
    else:  # a command on each channel (see _source_part and _dest_part)
        copy = _Copy(src, binding, other, dst, stream, route is _READY, created)
        sch.send(_source_part, copy)
        och.send(_dest_part, copy)
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


_STAGED, _ENABLE, _READY = "staged", "enable", "ready"
"""``to_client``'s routes: staged through the host; a peer copy once a worker thread
enabled peer access between the two devices; a peer copy now."""


_ready: dict[tuple[int, int], tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
"""Pairs of servers (by id, the servers' weak references beside) a peer copy is ready
between: asked once (peer access, once on, stays on for these two server objects)."""


def _route(src: ClientParts, dst: ClientParts) -> str:
    a, b = src._server, dst._server
    key = (id(a), id(b))
    known = _ready.get(key)
    if known is not None and known[0]() is a and known[1]() is b:
        return _READY
    if a.properties.kind != "cuda" or b.properties.kind != "cuda":
        return _STAGED
    peer = _peer_module()
    if not peer.can_copy(a, b):
        return _STAGED
    if peer.enable_peer_job(a, b) is not None:
        return _ENABLE
    if len(_ready) >= 256:  # clients opened and closed by the hundred: start again
        _ready.clear()
    _ready[key] = (weakref.ref(a), weakref.ref(b))
    return _READY


def _fail(client: ClientParts, dst: Handle, stream: StreamId, exc: BaseException) -> None:
    client.server.fail_handle(dst, exc)  # type: ignore[attr-defined]
    client._channel.hold(stream, exc)


def _fail_copy(client: ClientParts, dst: Handle, stream: StreamId, exc: BaseException) -> None:
    """:func:`_fail` for a peer copy: the new handle may be allocated already (the copy
    itself failed), so it also carries ``exc`` (each later use raises it)."""
    _fail(client, dst, stream, exc)
    client._channel.taint(stream, [dst.binding()], exc)


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


# -- the peer copy ---------------------------------------------------------------------

_NEW, _EXPORTED, _DEST_WAITS, _DONE = range(4)
"""A peer copy's phases: nothing ran; the source exported (and waits for the copy,
unless the export failed); the destination's command waits for the source's to run
it all; done (or given up)."""


class _Copy:
    """One peer copy, shared by its two commands (one queued on each client's channel)."""

    __slots__ = (
        "binding", "copied", "created", "dst", "enabled", "error", "other", "phase", "ready",
        "source", "src", "stream",
    )  # fmt: skip

    def __init__(
        self,
        src: ClientParts,
        binding: Binding,
        other: ClientParts,
        dst: Handle,
        stream: StreamId,
        enabled: bool,
        created: bool,
    ) -> None:
        self.src, self.binding, self.other, self.dst, self.stream = src, binding, other, dst, stream
        self.enabled = enabled
        """Peer access between the two devices is on (else a worker thread turns it on)."""
        self.created = created
        """``dst`` is allocated already (``FastLaunch.empty`` took it)."""
        self.phase = _NEW
        self.source: Any = None
        """The export (:func:`.cuda.peer.export`), once the source ran it alone."""
        self.error: BaseException | None = None
        """The export's failure, for the destination to hold."""
        self.ready: asyncio.Future[None] | None = None
        """Set while the destination's command waits for the source's (it copies)."""
        self.copied: asyncio.Future[Any] | None = None
        """Set while the source's command waits for the destination's copy."""

    def on_dropped(self, channel: Any) -> None:
        """One side's command was dropped unissued (its client closed with
        ``cancel_pending=True``): the other side, waiting or still to run, is told, so
        that it never waits for it; the new handle carries the error."""
        error = ClientClosedError(
            "to_client: the other client closed with cancel_pending=True before the copy "
            "was issued; nothing was copied"
        )
        if channel is self.other._channel:  # the destination's command: no copy
            waiting = self.copied if self.phase == _EXPORTED else None
            self.phase = _DONE  # a source command still to run does nothing
            if waiting is not None and not waiting.done():
                waiting.set_exception(error)
                waiting.exception()  # retrieved: the source only gives its event back
        elif self.phase == _DEST_WAITS:  # the source's: the destination's command waits
            if self.ready is not None and not self.ready.done():
                self.ready.set_exception(error)
        elif self.phase == _NEW:  # the destination's command still to run fails the copy
            self.phase, self.error = _EXPORTED, error


_peer: Any = None
""":mod:`.cuda.peer`, once a client asked for a route (CUDA only: not imported before)."""


def _peer_module() -> Any:
    global _peer
    if _peer is None:
        from ..cuda import peer

        _peer = peer
    return _peer


def _peer_enabled(copy: _Copy) -> bool:
    """True once the two devices reach each other (else a worker thread enables it)."""
    if not copy.enabled:
        copy.enabled = _peer_module().enable_peer_job(copy.src.server, copy.other.server) is None
    return copy.enabled


def _whole(copy: _Copy) -> None:
    """:func:`_inline` for a copy sent as two commands (one of them runs it all)."""
    copy.phase = _DONE
    _inline(copy.src, copy.binding, copy.other, copy.dst, copy.stream, copy.created)


def _inline(
    src: ClientParts,
    binding: Binding,
    other: ClientParts,
    dst: Handle,
    stream: StreamId,
    created: bool,
) -> None:
    """The whole copy, each side's part with its device current (the source's is, as
    for each of its commands; :mod:`.cuda.peer` switches to the destination's for the
    import and back for the finish: two switches): export on the source, import and
    copy on the destination, finish on the source. Both actors are between two commands
    (or the destination's awaits this copy), so both sides' order is kept; a failure
    is held as each part holds it alone."""
    peer = _peer
    try:
        source = peer.export(src._server, binding, stream)
    except BaseException as exc:
        src._channel.hold(stream, exc)
        other._channel.activate()
        _fail_copy(other, dst, stream, _twin(exc))
        other._channel.ran_inline()
        return
    try:
        copied = peer.import_copy(other._server, dst, source, stream, created)
    except BaseException as exc:
        _fail_copy(other, dst, stream, exc)
        peer.abandon(src._server, source)
        return
    finally:
        other._channel.ran_inline()  # the destination's batch ends with the iteration
    peer.finish(src._server, other._server, source, copied, binding)


def _source_part(copy: _Copy) -> Any:
    """The source's command: the whole copy when the destination's command waits for it
    or is at the head of its queue; else the export, then a wait for the copy."""
    if copy.phase == _DONE:  # the destination gave up (its actor ended)
        return None
    if copy.phase == _DEST_WAITS:  # the destination's actor awaits this, its order kept
        _whole(copy)
        _settle(copy.ready, None)
        return None
    other = copy.other
    if _peer_enabled(copy) and other._channel.claim(_dest_part, copy):
        _whole(copy)
        return None
    src = copy.src
    try:
        source = _peer_module().export(src.server, copy.binding, copy.stream)
    except BaseException as exc:
        src._channel.hold(copy.stream, exc)
        copy.phase, copy.error = _EXPORTED, exc  # the destination holds it too
        return None
    copy.phase, copy.source = _EXPORTED, source
    copy.copied = _watched(other._channel, src.loop)
    return _source_waits(copy, copy.copied)


async def _source_waits(copy: _Copy, copied: asyncio.Future[Any]) -> None:
    await _wait(copied)
    src, peer = copy.src, _peer_module()
    src._channel.activate()
    if copied.exception() is not None:  # nothing copied: the event goes back
        peer.abandon(src.server, copy.source)
        return
    peer.finish(src.server, copy.other.server, copy.source, copied.result(), copy.binding)


def _dest_part(copy: _Copy) -> Any:
    """The destination's command: the copy when the source exported (it waits for it),
    the whole copy when the source's command is at the head of its queue; else a wait
    (for peer access to be enabled, or for the source's command to run it all)."""
    if copy.phase == _EXPORTED and _peer_enabled(copy):
        _import(copy)
        return None
    if copy.phase == _NEW and _peer_enabled(copy) and copy.src._channel.claim(_source_part, copy):
        copy.src._channel.activate()  # the source's part first
        _whole(copy)
        return None
    return _dest_waits(copy)


async def _dest_waits(copy: _Copy) -> None:
    src, other = copy.src, copy.other
    try:
        job = _peer_module().enable_peer_job(src.server, other.server)
        if job is not None:
            await other._jobs.run(job)
        if copy.phase == _NEW:  # the source's command runs the whole copy for this one
            copy.ready = ready = _watched(src._channel, other.loop)
            copy.phase = _DEST_WAITS
            await _wait(ready)
            ready.result()  # the source's actor died first: raised, and held below
            return
    except BaseException as exc:
        _give_up(copy, exc)
        if isinstance(exc, other._channel.backend.cancelled):
            raise  # the actor is being cancelled: the copy failed, and the actor ends
        return
    other._channel.activate()
    _import(copy)


def _import(copy: _Copy) -> None:
    """The destination's part after the source's export: copy, and hand the event after
    it to the source's waiting command (or hold the export's failure)."""
    other = copy.other
    if copy.error is not None:
        copy.phase = _DONE
        _fail_copy(other, copy.dst, copy.stream, _twin(copy.error))
        return
    try:
        copied = _peer_module().import_copy(
            other.server, copy.dst, copy.source, copy.stream, copy.created
        )
    except BaseException as exc:
        _give_up(copy, exc)
        return
    copy.phase = _DONE
    _settle(copy.copied, copied)


def _give_up(copy: _Copy, exc: BaseException) -> None:
    """The destination failed before copying: the source's waiting command is told (its
    event goes back), a source command not run yet does nothing, and the new handle
    carries ``exc``."""
    if copy.phase == _DONE:  # the source's command ran it all: its outcome stands
        return
    waiting = copy.copied if copy.phase == _EXPORTED else None
    copy.phase = _DONE
    if waiting is not None and not waiting.done():
        waiting.set_exception(exc)
        waiting.exception()  # retrieved: the source side only looks at it
    _fail_copy(copy.other, copy.dst, copy.stream, exc)


def _watched(setter: Any, loop: Any) -> asyncio.Future[Any]:
    """A future the command of ``setter`` (a Channel) sets; failed at once if that
    channel's actor dies first (or has died, or the client is closed: its queue ran or
    was dropped)."""
    fut: asyncio.Future[Any] = loop.create_future()
    if setter.state is State.DEAD or setter.state is State.CLOSED:  # nothing runs there
        fut.set_exception(setter.unusable())
    else:
        setter.track(fut)
    return fut


def _settle(fut: asyncio.Future[Any] | None, value: Any) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


def _twin(exc: BaseException) -> BaseException:
    """A copy of ``exc`` (the export's failure, held on the source too) for the
    destination to hold: each client's held errors number theirs in their own order, so
    one exception object cannot be held by both."""
    try:
        dup = copy_module.copy(exc)
    except Exception:  # an exception type that does not copy: both hold the one
        return exc
    dup.__cause__ = exc.__cause__
    return dup
