"""Device-to-device copies between two CUDA servers (``to_client``'s P2P path).

The copy runs on the destination's stream after an event from the source's stream
(``cuMemcpyPeerAsync``, direct over NVLink/PCIe once peer access is enabled, which is
done once per pair of devices); then the source's stream waits for an event after the
copy, and the source binding is held until the source stream passes it. So both sides
are ordered and the source memory stays alive until the copy ran. Devices that cannot
reach each other take the staged path of :mod:`..transfer` instead.

The source's event is kept per source stream (a :class:`_Mark`, with the cursor it was
recorded at): copies sent back to back from one stream, with nothing resolved on it in
between and the buffer last used there, reuse it, and a destination stream that
already waited on it does not wait again (the device-side cost of a copy is mostly
these cross-device records and waits; reused, the copies no longer ping-pong between
the two devices). A source stream with nothing left to run (``cuStreamQuery``) records
no event: the destination has nothing to wait for.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Final

from ..values.stream_id import StreamId
from ..values.types import Binding, Handle
from . import driver
from .driver import check, cu, error_from, set_current
from .native.hotpath import hot

if TYPE_CHECKING:
    from .server import CudaServer

__all__ = [
    "Export",
    "abandon",
    "can_copy",
    "describe_links",
    "enable_peer_job",
    "enter",
    "export",
    "finish",
    "import_copy",
    "is_current",
    "peer_links",
]

_ALREADY_ENABLED: Final = 704  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
_enabled: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
"""Per server, the servers it has peer access with (its context's and its pool's): per
server object, not per device pair, since closing a client resets its device's primary
context and its new client has a new pool, so both must be enabled again."""
_lock = threading.Lock()
_reach: dict[tuple[int, int], bool] = {}

Export = tuple[int, Any, "_Mark", Any]
"""(source pointer, source context, the mark of the source's work, source CUDA stream)."""


class _Mark:
    """The last event a source stream recorded for peer copies (None: the stream had
    nothing left to run), the stream's cursor at that point, and the destination
    streams (their ``StreamWrapper`` objects, held) that already wait on it. Replaced as
    soon as anything else resolves on the source stream; its event goes back to the
    pool once replaced and no copy holds it any more (``users``)."""

    __slots__ = ("cursor", "event", "owned", "retired", "users", "waited")

    def __init__(self, event: Any, cursor: int) -> None:
        self.event = event
        self.owned: list[Any] = [] if event is None else [event]
        """The event until it goes back (taken by one ``pop``: the close thread's hook
        and the loop's last copy may both try)."""
        self.cursor = cursor
        self.users = 0
        self.retired = False
        self.waited: set[object] = set()

    def give_back(self, events: Any) -> None:
        """The event back to ``events`` (once, whoever asks first)."""
        try:
            event = self.owned.pop()
        except IndexError:
            return
        events.give(event)


_marks: weakref.WeakKeyDictionary[Any, dict[object, _Mark]] = weakref.WeakKeyDictionary()
"""Per source server, the mark of each of its streams (keyed by ``StreamWrapper``)."""


def _ordinal(server: CudaServer) -> int:
    return server.context.ordinal


def can_copy(src: Any, dst: Any) -> bool:
    """True if both are CUDA servers and the destination can read the source's memory
    directly (the same device, or peer access possible)."""
    if getattr(src, "properties", None) is None or src.properties.kind != "cuda":
        return False
    if dst.properties.kind != "cuda":
        return False
    a, b = _ordinal(src), _ordinal(dst)
    if a == b:
        return True
    key = (b, a)
    if key not in _reach:
        d = cu()
        dev_a, dev_b = check(d.cuDeviceGet(a)), check(d.cuDeviceGet(b))
        _reach[key] = bool(check(d.cuDeviceCanAccessPeer(dev_b, dev_a), "cuDeviceCanAccessPeer"))
    return _reach[key]


def peer_links(count: int) -> list[tuple[int, int, bool]]:
    """``(a, b, can access)`` for each ordered pair of the first ``count`` devices."""
    d = cu()
    devs = [check(d.cuDeviceGet(i), "cuDeviceGet") for i in range(count)]
    out = []
    for a in range(count):
        for b in range(count):
            if a != b:
                res = d.cuDeviceCanAccessPeer(devs[a], devs[b])
                out.append((a, b, bool(not res[0] and res[1])))
    return out


def describe_links(count: int) -> list[str]:
    """One line per pair of the first ``count`` GPUs: peer copy or staged (blocking)."""
    by_pair = {(a, b): ok for a, b, ok in peer_links(count)}
    out = []
    for a in range(count):
        for b in range(a + 1, count):
            both = by_pair[(a, b)] and by_pair[(b, a)]
            how = "peer-to-peer (cuMemcpyPeerAsync)" if both else "staged through pinned memory"
            out.append(f"cuda:{a} <-> cuda:{b}  {how}")
    return out


def enable_peer_job(src: CudaServer, dst: CudaServer) -> Any:
    """A job (for a worker thread) enabling peer access both ways, or None if done."""
    a, b = _ordinal(src), _ordinal(dst)
    if a == b or _is_enabled(src, dst):
        return None

    def job() -> None:
        with _lock:
            if _is_enabled(src, dst):
                return
            _enable(dst.context.context, src.context.context)
            _enable(src.context.context, dst.context.context)
            _grant(src, b)  # pool memory ignores context peer access: its pool must
            _grant(dst, a)  # let the other device in
            for one, other in ((src, dst), (dst, src)):
                peers = _enabled.get(one)
                if peers is None:
                    peers = _enabled[one] = weakref.WeakSet()
                peers.add(other)

    return job


def _is_enabled(src: CudaServer, dst: CudaServer) -> bool:
    peers = _enabled.get(src)
    return peers is not None and dst in peers


def _enable(accessor: Any, peer: Any) -> None:
    d = cu()
    set_current(accessor)
    (err,) = d.cuCtxEnablePeerAccess(peer, 0)
    if err and int(err) != _ALREADY_ENABLED:
        check((err,), "cuCtxEnablePeerAccess")


def _grant(server: CudaServer, peer: int) -> None:
    """Let device ``peer`` read and write the memory of ``server``'s stream-ordered pool
    (``cuMemPoolSetAccess``; its pages come from there)."""
    pool = getattr(server._storage, "_pool", None)
    if pool is None:  # cuMemAlloc pages follow the contexts' peer access
        return
    d = cu()
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = peer
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(d.cuMemPoolSetAccess(pool, [desc], 1), "cuMemPoolSetAccess")


def is_current(server: CudaServer) -> bool:
    """True if ``server``'s context is current on the calling thread, as
    :func:`.driver.set_current` (or :func:`enter`) last made it (the one-call routes'
    condition: ``FastLaunch.empty`` declines otherwise)."""
    return getattr(driver._tls, "context", None) is server._ctx.context


def enter(server: CudaServer) -> None:
    """Make ``server``'s context current on the calling thread unless it is:
    :func:`.driver.set_current`'s contract (its thread-local mark, which the one-call
    routes check), through the hot path's ``cuCtxSetCurrent`` (no cuda.bindings wrapper:
    a peer copy switches twice)."""
    context = server._ctx.context
    tls = driver._tls
    if getattr(tls, "context", None) is not context:
        err = hot.ctx_set(context)
        if err:
            raise error_from(err, "cuCtxSetCurrent")
        tls.context = context


def export(server: CudaServer, binding: Binding, stream: StreamId) -> Export:
    """The source side: the binding's address and the mark of the work queued on
    ``stream`` that touches it (actor, source context current): the stream's mark
    reused when nothing resolved on ``stream`` since it and the buffer was last used
    there (``_Mark``), else a new one (an event, or none if the stream is idle)."""
    ptr = server._ptr(binding)
    streams = server._streams
    own = stream.value % streams.max_streams
    origin = streams.last_use.get(binding.memory.id)
    local = (binding.stream if origin is None else origin[0]).value % streams.max_streams == own
    resolved = streams.resolve(stream, [binding])
    cu_stream = resolved.stream
    wrapper = streams.streams.slots[own]
    marks = _marks.get(server)
    if marks is None:
        marks = _marks[server] = {}
        events = server._events  # (not the server: no cycle through its hooks)
        server.close_hooks.append(lambda: _retire_all(marks, events))
    mark = marks.get(wrapper)
    if mark is None or not local or mark.cursor != resolved.cursor - 1:
        mark = _new_mark(server, cu_stream, marks, wrapper, mark)
    mark.cursor = resolved.cursor
    mark.users += 1
    return ptr, server._ctx.context, mark, cu_stream


def _new_mark(
    server: CudaServer,
    cu_stream: Any,
    marks: dict[object, _Mark],
    wrapper: object,
    old: _Mark | None,
) -> _Mark:
    """A new mark of ``cu_stream``'s work so far (no event if the stream has nothing
    left to run: everything queued on it, the buffer's writers among them, passed);
    ``old`` is retired (its event back once no copy holds it)."""
    idle = hot.stream_query(cu_stream) == 0
    mark = _Mark(None if idle else server._events.record(cu_stream), 0)
    marks[wrapper] = mark
    if old is not None:
        old.retired = True
        _release(server, old, 0)
    return mark


def _retire_all(marks: dict[object, _Mark], events: Any) -> None:
    """The source server closes (its close thread, before its events are destroyed):
    the events of its marks go back to the pool (a copy still holding one gives it back
    when it lets go)."""
    for mark in list(marks.values()):
        mark.retired = True
        if not mark.users:
            mark.give_back(events)
    marks.clear()


def _release(server: CudaServer, mark: _Mark, users: int = 1) -> None:
    """``users`` copies no longer hold ``mark``: its event goes back to the pool once it
    is retired and none does."""
    mark.users -= users
    if mark.retired and not mark.users:
        mark.give_back(server._events)


def import_copy(
    server: CudaServer, handle: Handle, source: Export, stream: StreamId, created: bool = False
) -> Any:
    """The destination side, its context made current (:func:`enter`): reserve
    ``handle`` (unless ``created``: the one-call allocation took it), wait for the
    source's mark (unless the stream already waits on it, or it has no event), copy;
    return an event after the copy."""
    enter(server)
    ptr, ctx, mark, _ = source
    binding = handle.binding()
    streams = server._streams
    if created:
        dst = server._ptr(binding)
        streams.resolve(stream, [binding])
    else:
        server.create([handle], stream)
        dst = server._ptr_slow(binding)  # a new handle: its address is not cached yet
        # created just now on ``stream``: what ``resolve`` does for it (no other stream
        # to wait for), the cursor advanced and the copy stamped as its last use
        cursor = streams.advance(stream)
        streams.last_use[binding.memory.id] = (stream, cursor)
    wrapper = streams.streams.get(stream)
    cu_stream = wrapper.stream
    event = mark.event
    if event is not None and wrapper not in mark.waited:
        err = hot.stream_wait_event(cu_stream, event)
        if err:
            raise error_from(err, "cuStreamWaitEvent(peer)")
        mark.waited.add(wrapper)
    err = hot.memcpy_peer(dst, server._ctx.context, ptr, ctx, binding.size, cu_stream)
    if err is None:  # a driver without the entry point the hot path looks up
        err = cu().cuMemcpyPeerAsync(dst, server._ctx.context, ptr, ctx, binding.size, cu_stream)[0]
    if err:
        raise error_from(err, "cuMemcpyPeerAsync")
    return server._events.record(cu_stream)


def abandon(src: CudaServer, source: Export) -> None:
    """The source side when the destination failed before copying: its context current
    again, the event goes back."""
    enter(src)
    _release(src, source[2])


def finish(src: CudaServer, dst: CudaServer, source: Export, copied: Any, binding: Binding) -> None:
    """The source side again, its context current again: its stream waits for the copy;
    the binding is held until the source stream passes that point; the copy's event
    goes back to its pool, and the copy lets go of the source's mark."""
    enter(src)
    _, _, mark, stream = source
    _release(src, mark)
    err = hot.stream_wait_event(stream, copied)
    if err:
        raise error_from(err, "cuStreamWaitEvent(peer done)")
    dst._events.give(copied)
    src._retirer.hold(stream, binding)
