"""A launch's whole route in one call: the hot path's ``FastLaunch``.

``client.execute(kernel, count, bindings, mode)`` on CUDA first offers the launch to a
``FastLaunch`` built here for the client's channel and server (the compiled one from
``_native_fast.c``, or its twin ``_twin_fast.py``). It does in one call what the Python
route does through ``ComputeClient.execute`` -> ``Channel.send`` (run inline) ->
``Launcher.launch`` -> ``LaunchOps.execute``, for the launch that route runs
without surprises:

* the channel is open, called on its loop (asyncio's; under trio, the backend says),
  no graph capture is open, and the actor is idle with nothing queued, or every queued
  command is tracked by the channel's footprint (``channel/footprint.py``: no sync,
  close or other command of unknown reach waits, the actor awaits none) and none of
  them is on the caller's stream or binds one of the command's buffers (the channel's
  1 ms inline budget does not apply, nor does a launch taken here count against it: it
  costs the caller about what queueing it would, and the caller holds the loop either
  way, while a queued launch costs the actor its whole route again later);
* the calling task's stream is found as ``StreamId.current()`` finds it (a task's first
  command calls it, to mint the stream; a stream's first operation creates it);
* the device's context is current as ``driver.set_current`` last made it on this
  thread (what the route's ``activate()`` checks; asking the driver would cost a driver
  call), and no kernel recorder (profiling) is on;
* the kernel is loaded, its count static, and there are no tensor maps; at most four
  scalar groups (dtypes: ``y = a*x + b`` over ``n`` binds a float32 and a uint32 group,
  put in ABI order by ``Bindings.ordered_scalars()``, as ArgPacker puts them) and at
  most 32 buffers;
* every buffer's address is known (``ServerCore._pointers``'s fast path; a buffer no
  route has used yet, a new handle, has it found and cached by the server's ``_ptr``,
  whose error, a freed handle say, leaves the launch to the route), the bindings'
  signature was checked against the kernel, and under CHECKED the grid is the one last
  found within the device's limits;
* every buffer was last used on this stream's slot (no cross-stream wait is needed).

It then moves the stream's cursor and stamps the buffers, as ``MultiStream.resolve``
does, fills the argument block and calls ``cuLaunchKernel``; a failure from there on
is held for the stream through ``Channel.hold`` and taints the launch's buffers, as
``Launcher.launch`` does (:func:`_hold_launch`). Anything
else returns False before any state changed, and the caller takes the Python route,
which handles the rest (and raises what it raises). ``stats`` counts both outcomes.

``fast.queued(kernel, count, bindings, mode, sid)`` is the same route for a launch that
waited in the channel's queue, offered by ``Launcher.launch`` when the actor runs
it (a caller running it inline was just declined): on the StreamId it was sent with,
on the same conditions less the caller's (its loop, an idle actor with nothing queued),
and without ending the server's batch (the actor does). ``queued_stats`` counts it apart.

``fast.read(item)`` does the same for an awaited read of one Handle or Binding of at
most ``SMALL_READ`` bytes (``client.read([h])``), on the same conditions plus: no error
held for any stream (the route raises it) and a spare pinned buffer of that size (one
is kept after the route's first read of the size). It queues the copy, then:

* when other tasks are ready to run and the reads that spun lately waited long
  (``DEFER_ABOVE_S``), it defers (issue 38: concurrency pays): the caller suspends, and
  ``fast.sweep``, one loop callback an iteration for every read waiting so, settles
  each read the device is done with (a stream query while the stream's cursor has not
  moved: the copy is its last work; else once a later read there marked the stream
  done past it), so the loop runs the other tasks' work while the device copies.
  "Ready" is asyncio's ready queue holding more than the channel's end of batch; on
  another asyncio loop (uvloop, whose queue is not visible) reads defer while others
  wait or after a sweep that settled several, and one read in 32 defers to find other
  tasks; under trio they never defer;
* else it polls the stream for up to 30 µs, as the completion watcher's first spin
  does: a short read's future is resolved before it is returned, so awaiting it does
  not suspend.

A read not done within 30 µs of its issue (or whose stream got later work first) is
handed to the watcher (:func:`_read_later`: an event recorded then, with the errors held
at the read's issue). None: the route takes the read. Once a read is done (any way), the
stream is marked done up to it, as a sync marks it (the copy was queued after all the
stream's earlier work): what was last used there before it is free at once when
dropped, so ``fast.empty`` can take it without a sync. A deferred read's future is among
the channel's pending ones (an actor's death fails it), and the server's ``close()``
first hands every deferred read to the watcher (``fast.flush_reads``), on the loop
thread, before any stream it would query is destroyed.

``fast.write(item, data)`` (``_native_write.c``) takes the copy of ``client.create(data)``
for ``bytes`` of exactly the length of one Handle or Binding and at most ``SMALL_WRITE``
bytes (the handle ``fast.empty`` just took), on the same conditions as a launch plus:
no buffer tainted (the route's write clears a taint), and a page-locked staging buffer
of that size the server keeps (``_small_writes``) that the device is done with: its
last copy's stamp passed by its stream's ``done`` (a completed read or sync marks it, as
for a dropped slice), or a new one ``TransferOps.write_spare`` gives (at most
``WRITE_SPARES`` per size and ``WRITE_SPARE_BYTES`` in all; None: the route stages that
write through its pool and retirer). It copies the bytes into it and queues
``cuMemcpyHtoDAsync`` after moving the cursor and the stamp, as ``_write_one`` does; the
buffer goes back on the list with the copy's stamp; a refused copy is held for the
stream and taints the buffer (:func:`_hold_launch`), as ``fire_writing`` does. The
route's own small writes of ``bytes`` stage through the same spares (``_write_one``),
so a size the route wrote (a warm-up's create, say) has its spare here. The
spares are released at the server's close. False: nothing changed, the route writes.
``write_stats`` counts these offers apart from the other routes'.

``fast.empty(size)`` (``_native_alloc.c``, twin ``_twin_alloc.py``) takes
``client.empty(size)`` (and ``create``'s allocation) on the same channel conditions when
a slice of exactly ``size`` requested bytes, in the pool a reservation of ``size`` goes
to, is there to take: one dropped since the server's last collection (every dropped
one free at once, as ``_forget`` decides), or one pending in the memory manager (let go
of by the server, not yet back in its pool). The route would hand such slices back and
reserve again; here the slice goes to the new handle, minted and stamped as ``create``
stamps it, with its device address (a dropped slice's; a pending one's when this route
sent it back and it is still that range: the same slice object, page and offset), and
the manager's periodic cleanup runs when due, as in ``reserve``. None:
the route takes it (the persistent mode, a size that is not exactly an int, a dropped
slice the device may still use, or no slice that fits).

``fast.export(item, consumer, event)`` (``_native_write.c``) takes the ordering of a
DLPack export with a consumer stream (``tensor.__dlpack__(stream=...)``, what
``torch.from_dlpack`` and ``cupy.from_dlpack`` call: ``client/interop.py``) on the
conditions of a read, of any size: it stamps the buffer on the task's stream as
``resolve`` does, records ``event`` (the server's one export event,
``InteropOps.export_event``) there and makes ``consumer`` (a raw stream handle, whose
device the caller checked) wait for it, as ``export_to_stream`` does; it returns the
address of the item's first byte. A refused record or wait raises the driver's error
there, as the route's does. None: nothing changed, the route exports. The client offers
it on the compiled path only (``InteropOps.one_call_export``); ``export_stats`` counts it.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
from typing import TYPE_CHECKING, Any

from ..values import stream_id
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.slices import SliceHandle
from ..values.stream_id import StreamId
from ..values.types import Binding, ExecutionMode, Handle
from . import driver
from .driver import error_from
from .native.hotpath import hot
from .storage import PinnedBuffer
from .transfers import SMALL_READ, SMALL_WRITE, TransferOps

if TYPE_CHECKING:
    from ..channel.channel import Channel

__all__ = ["DEFER_ABOVE_S", "FastLaunch", "fast_launch"]

DEFER_ABOVE_S = 15e-6
"""A small read defers (other tasks ready) only while the reads that spun lately waited
at least this long on average (one in 32 spins anyway, to measure again): a suspension
and its wake-up cost about what a short spin does. On an H200, 64 tasks of a request
whose kernel keeps its stream 20 µs cost 38.4 µs each deferring, 48.8 spinning; with the
benchmark's trivial kernel (spins of 4-10 µs) deferring cost up to 1.6x at 64 KiB
(``benchmarks/profiles/requests/read-deferral-h200.md``)."""

FastLaunch = Any
"""``hot.FastLaunch``: callable as ``fast(kernel, count, bindings, mode) -> bool``."""


def fast_launch(server: TransferOps, channel: Channel) -> FastLaunch:
    """The ``FastLaunch`` of ``server`` driven through ``channel``."""
    from ..channel.channel import State

    loop = channel.loop
    on_loop: Any
    task_fn: Any
    task_arg: Any
    if channel.backend.name == "asyncio":
        on_loop, task_fn, task_arg = None, _current_task(), loop
    else:  # trio's adapter: the backend says whether we are on its run
        on_loop, task_fn, task_arg = channel.backend.on_loop, stream_id.current_task, None
    streams = server._streams
    hold = functools.partial(_hold_launch, channel)
    fast = hot.FastLaunch(
        channel, loop, State.OPEN, asyncio._get_running_loop, on_loop, task_fn, task_arg,
        stream_id._pinned, stream_id._owned, Kernel, CubeCount, Bindings, ExecutionMode,
        ExecutionMode.CHECKED, server._kernels, server._addresses, server._table,
        server._packer._packs, streams.last_use, streams.streams.slots, server.recorder,
        hold, error_from, channel._end_inline_batch, loop.call_soon, channel._wake,
        driver._tls, server._ctx.context, stream_id.StreamId.current, streams.streams.get_index,
        streams.max_streams,
    )  # fmt: skip
    fast.set_pointers(server._ptr)  # a buffer's first use: its address found and cached
    later = functools.partial(_read_later, server, channel)
    fast.set_read(Handle, Binding, server._small_reads, SMALL_READ, later, channel._fail,
                  channel.future_factory())  # fmt: skip
    fast.set_defer(_ready_signal(channel), channel._pending, server.read_spare, DEFER_ABOVE_S)
    server.before_close.append(fast.flush_reads)
    fast.set_write(server._small_writes, SMALL_WRITE, server.write_spare)
    table, memory = server._table, server._memory
    fast.set_alloc(
        Handle, SliceHandle, table._ids, table._slices, table.failed, table.queue._queue,
        server._created_at, memory, memory._slices, memory.queue._queue,
        server.properties.max_allocation,
    )  # fmt: skip
    return fast


def _ready_signal(channel: Channel) -> Any:
    """How ``FastLaunch.read`` sees other tasks ready to run (see above): asyncio's
    ready queue (a deque), True on another asyncio loop (uvloop's queue is not
    visible: the read defers while reads wait, or after a sweep that settled several),
    None under trio (never defers)."""
    if channel.backend.name != "asyncio":
        return None
    ready = getattr(channel.loop, "_ready", None)
    return ready if type(ready) is collections.deque else True


def _current_task() -> Any:
    """``asyncio.current_task`` as the routes call it, ``fn(loop)``: where it is a Python
    function over asyncio's dict of each loop's current task (3.11: ``_current_tasks.get
    (loop)``, all it does when given the loop), that dict's ``get``, a call without a
    Python frame (the routes ask it up to five times a request); else itself."""
    tasks = getattr(asyncio.tasks, "_current_tasks", None)
    if type(tasks) is dict and inspect.isfunction(asyncio.current_task):
        return tasks.get
    return asyncio.current_task


def _hold_launch(
    channel: Channel, sid: StreamId, exc: BaseException, mids: tuple[int, ...]
) -> None:
    """A launch the route issued failed: hold ``exc`` for ``sid`` and taint its buffers
    (memory ids ``mids``), as the Python route does (called by the route, both hot paths)."""
    channel.hold(sid, exc)
    channel._held.taint(mids, exc)


def _read_later(
    server: TransferOps,
    channel: Channel,
    sid: StreamId,
    cu_stream: Any,
    buf: PinnedBuffer,
    nbytes: int,
    fut: asyncio.Future[Any],
    mark: int | None = None,
) -> None:
    """A small read ``FastLaunch.read`` queued that was not done within its spin (or,
    deferred, not within 30 µs of its issue, or its stream got later work first): the
    route's completion (an event recorded now, watched on the loop) settles ``fut``,
    with the errors held for ``sid`` up to ``mark`` (a deferred read's: those held at
    its issue; else now), and marks the stream done up to the read, as the route's
    reads do."""
    completion = server._complete_read(sid, cu_stream, lambda: server.finish_small(buf, nbytes))
    channel._pending.add(fut)
    if mark is None:
        mark = channel._held.mark()
    channel.watcher.watch(completion, lambda done: channel._resolve(fut, sid, mark, done))
