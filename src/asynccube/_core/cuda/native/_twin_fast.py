"""The pure-Python twin of ``_native_fast.c``'s ``FastLaunch`` (see :mod:`.fast`).

The same steps in the same order: everything a launch needs is found first, and any
surprise returns False before a state changes (the caller then takes the Python
route); then the stream's cursor and the buffers' last-use stamps move, the argument
block is filled and the kernel launched, an error being held for the stream.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

from ._twin_alloc import Allocator
from ._twin_args import _need_driver, _u64
from ._twin_args import state as _driver
from ._twin_launch import launch

__all__ = ["FastLaunch"]

_MAX_BUFFERS = 32
_MAX_SCALAR_GROUPS = 4  # as the C module: a launch with more scalar dtypes takes the route
_SPIN_S = 30e-6  # as CompletionWatcher's sync_spin_seconds
_NOT_READY = 600  # CUDA_ERROR_NOT_READY
_PROBE_EVERY = 32  # mode 2: a read in this many defers, to find other tasks
_SWEEP_WAITING = 2  # a sweep stops querying after this many not done
_SPIN_WEIGHT = 8.0  # the recent spins' average: each spin counts this much less than the sum
_READ_SPARES, _READ_SPARE_BYTES = 64, 4 << 20  # as transfers.READ_SPARES, READ_SPARE_BYTES


class _Plan:
    __slots__ = ("ahead", "function", "grid", "meta", "mids", "nbytes", "pack", "ptrs",
                 "scalar", "shape", "sid", "stream", "wrapper")  # fmt: skip

    def __init__(self) -> None:
        self.ahead = False  # commands are queued: only those of other streams and buffers

    ahead: bool
    function: Any
    grid: tuple[int, int, int]
    meta: Any
    mids: list[Any]
    nbytes: int
    pack: Any
    ptrs: list[int]
    scalar: Any  # each scalar group's bytes in ABI order (a list), or None: no group
    shape: tuple[int, int, int, int]
    sid: Any
    stream: Any
    wrapper: Any


class FastLaunch:
    """``FastLaunch(...)(kernel, count, bindings, mode) -> bool`` (see :mod:`.fast`)."""

    __slots__ = (
        "_allocator", "_crowd", "_d_hits", "_d_later", "_declined", "_defer_above", "_defer_mode",
        "_deferred",
        "_footprint", "_hits", "_pending_set", "_q_declined", "_q_hits", "_read_miss",
        "_ready", "_since_defer", "_since_spin", "_spin_avg", "_sweep_scheduled", "addresses",
        "binding_t", "bindings_t", "call_soon", "channel", "checked", "context", "count_t",
        "create_future", "current_sid", "end_batch", "error_from", "fail", "get_index", "get_loop",
        "handle_t", "hold", "kernel_t", "kernels", "last_use", "later", "loop",
        "max_streams", "mode_t", "on_loop", "open_state", "owned", "packs", "pinned", "ptr_miss",
        "recorder", "slots", "small_max", "small_reads", "small_writes", "table", "task_arg",
        "task_fn", "tls", "w_declined", "w_hits", "wake", "write_max", "write_miss",
        "x_declined", "x_hits",
    )  # fmt: skip

    def __init__(self, *args: Any) -> None:
        from ...errors import InvalidArgument

        if len(args) != 31:
            raise InvalidArgument(f"FastLaunch takes 31 arguments, got {len(args)}")
        (self.channel, self.loop, self.open_state, self.get_loop, self.on_loop, self.task_fn,
         self.task_arg, self.pinned, self.owned, self.kernel_t, self.count_t, self.bindings_t,
         self.mode_t, self.checked, self.kernels, self.addresses, self.table, self.packs,
         self.last_use, self.slots, self.recorder, self.hold, self.error_from, self.end_batch,
         self.call_soon, self.wake, self.tls, self.context, self.current_sid, self.get_index,
         max_streams) = args  # fmt: skip
        if not isinstance(max_streams, int) or not 1 <= max_streams <= 1 << 20:
            raise InvalidArgument(f"max_streams must be in [1, 2**20], got {max_streams!r}")
        self.max_streams = max_streams
        self._hits = self._declined = self._q_hits = self._q_declined = 0
        self.small_reads: Any = None
        self.small_writes: Any = None
        self.write_miss: Any = None
        self.write_max = 0
        self.w_hits = self.w_declined = 0
        self.x_hits = self.x_declined = 0
        self.ptr_miss: Any = None
        self._allocator: Allocator | None = None
        self._footprint: Any = None
        self._deferred: list[tuple[Any, ...]] = []
        self._ready: Any = None
        self._pending_set: Any = None
        self._read_miss: Any = None
        self._defer_above = self._spin_avg = 0.0
        self._since_spin = 0
        self._defer_mode = self._crowd = self._since_defer = 0
        self._sweep_scheduled = False
        self._d_hits = self._d_later = 0

    def set_footprint(self, footprint: Any) -> None:
        """The channel's ``Footprint`` (``channel/footprint.py``): with it, a route is
        taken while commands are queued, when all are tracked and none is on the
        command's stream or binds its buffers (see ``_native_plan.c``)."""
        from ...errors import InvalidArgument

        streams, buffers = (getattr(footprint, n, None) for n in ("streams", "buffers"))
        if type(streams) is not dict or type(buffers) is not dict:
            raise InvalidArgument("set_footprint needs an object with dicts streams and buffers")
        self._footprint = footprint

    def set_alloc(self, *args: Any) -> None:
        """What :meth:`empty` needs (see ``_native_alloc.c``)."""
        self._allocator = Allocator(*args)

    def empty(self, size: Any) -> Any:
        """A new Handle over a dropped slice of ``size`` bytes, or None (see fast.py)."""
        allocator = self._allocator
        return None if allocator is None else allocator.empty(self, size)

    def set_read(self, handle_t: Any, binding_t: Any, small_reads: Any, small_max: int,
                 later: Any, fail: Any, create_future: Any) -> None:  # fmt: skip
        """What :meth:`read` needs (see ``_native_read.c``)."""
        from ...errors import InvalidArgument

        if (
            not (isinstance(handle_t, type) and isinstance(binding_t, type))
            or not isinstance(small_reads, dict)
            or small_max < 0
        ):
            raise InvalidArgument(
                "set_read needs two types, a dict of spare buffers and a size >= 0"
            )
        self.handle_t, self.binding_t, self.small_reads = handle_t, binding_t, small_reads
        self.small_max, self.later, self.fail = small_max, later, fail
        self.create_future = create_future

    def set_defer(self, ready: Any, pending: Any, miss: Any, above: float) -> None:
        """When :meth:`read` defers its completion to :meth:`sweep` (see
        ``_native_read.c``): ``ready`` is asyncio's ready deque, True (another asyncio
        loop) or None (never); ``pending`` the channel's set of futures; ``miss(n)`` a
        new pinned buffer when every spare of size ``n`` is out (None: the route);
        ``above``: reads defer only while recent spins averaged at least this many
        seconds."""
        from ...errors import InvalidArgument

        if not isinstance(pending, set) or not callable(miss):
            raise InvalidArgument("set_defer needs the channel's set of futures and a callable")
        if not 0 <= above <= _SPIN_S:
            raise InvalidArgument(
                f"set_defer's threshold must be in [0, {_SPIN_S:g}] seconds, got {above:g}"
            )
        self._defer_above = above
        mode = 0 if ready is None else 2 if ready is True else 1
        if mode == 1 and not hasattr(ready, "__len__"):
            raise InvalidArgument(f"set_defer's ready must be a deque, True or None, got {ready!r}")
        self._ready = ready if mode == 1 else None
        self._pending_set, self._defer_mode, self._read_miss = pending, mode, miss

    @property
    def defer_stats(self) -> tuple[int, int]:
        """(reads deferred, of them handed to the route's completion)."""
        return self._d_hits, self._d_later

    def _should_defer(self, p: _Plan) -> bool:
        """Other tasks may run and recent spins waited long (see ``_native_read.c``);
        one read in 32 spins anyway, to see whether they still would."""
        if not self._defer_mode or not self._others_ready():
            return False
        if self._spin_avg < self._defer_above:
            return False
        if self._defer_above <= 0:  # (nothing to measure again)
            return True
        self._since_spin += 1
        if self._since_spin < _PROBE_EVERY:
            return True
        self._since_spin = 0
        return False

    def _others_ready(self) -> bool:
        mode = self._defer_mode
        if self._deferred:
            return True
        if mode == 1:
            own = int(self.channel._batch_end_scheduled is True) + int(self._sweep_scheduled)
            return len(self._ready) > own
        if self._crowd >= 2:
            return True
        self._since_defer += 1
        return self._since_defer >= _PROBE_EVERY

    def _spun(self, stream: Any) -> int:
        """``_spin`` for 30 µs, its time counted in the recent spins' average."""
        t0 = time.perf_counter()
        done = _spin(stream, _SPIN_S)
        self._spin_avg += (time.perf_counter() - t0 - self._spin_avg) / _SPIN_WEIGHT
        return done

    def _defer(self, p: _Plan, spare: list[Any], buf: Any, cursor: int, fut: Any) -> None:
        deadline = time.perf_counter() + _SPIN_S
        entry = (fut, buf, buf.ptr, p.nbytes, p.wrapper, cursor, p.stream, p.sid, spare,
                 deadline, self.channel._held._seq)  # fmt: skip
        self._pending_set.add(fut)
        self._deferred.append(entry)
        self._d_hits += 1
        self._since_defer = 0
        if not self._sweep_scheduled:
            self.call_soon(self.sweep)
            self._sweep_scheduled = True

    def _hand_over(self, e: tuple[Any, ...]) -> None:
        fut, buf, _, nbytes, _, _, stream, sid, _, _, mark = e
        self.later(sid, stream, buf, nbytes, fut, mark)
        self._d_later += 1

    def _settle(self, e: tuple[Any, ...], now: float) -> bool | None:
        """Settle ``e`` if its read is done, or hand it to the route (True: the device
        failed, or it is not done 30 µs after its issue); False: it waits; None: its
        stream got later work (the cursor moved) and is not marked done up to it (the
        second pass decides: :meth:`_settle_moved`)."""
        _, _, _, _, wrapper, cursor, stream, _, _, deadline, _ = e
        if wrapper.done >= cursor:  # a later read or sync there completed
            return self._finish(e)
        if wrapper.cursor != cursor:
            return None
        q = int(_driver["d"].cuStreamQuery(stream)[0])
        if q == _NOT_READY and now < deadline:
            return False
        if q != 0:  # the route waits longer, or raises the error
            self._hand_over(e)
            return True
        return self._finish(e)

    def _settle_moved(self, e: tuple[Any, ...], now: float) -> bool:
        """An entry whose stream got later work: done if the first pass marked it so,
        else waiting until 30 µs after its issue, then the route's (an event after it)."""
        if e[4].done >= e[5]:
            return self._finish(e)
        if now < e[9]:
            return False
        self._hand_over(e)
        return True

    def _finish(self, e: tuple[Any, ...]) -> bool:
        """The read of ``e`` is done: its bytes, its buffer back, its future settled."""
        fut, buf, host, nbytes, wrapper, cursor, _, _, spare, _, _ = e
        if wrapper.done < cursor:
            wrapper.done = cursor
        self._pending_set.discard(fut)
        data = [ctypes.string_at(host, nbytes)]
        _keep_spare(spare, buf)
        if not fut.done():  # (its task was cancelled)
            fut.set_result(data)
        return True

    def sweep(self) -> None:
        """Settle the deferred reads the device is done with, oldest first (a loop
        callback, once an iteration while reads wait; see ``_native_read.c``)."""
        self._sweep_scheduled = False
        if not self._deferred:
            return
        old, self._deferred = self._deferred, []
        rest: list[tuple[Any, ...]] = []
        moved: list[tuple[Any, ...]] = []
        now, settled = time.perf_counter(), 0
        for second, entries in ((False, old), (True, moved)):
            for e in entries:
                if not second and len(rest) >= _SWEEP_WAITING:
                    rest.append(e)
                    continue
                try:
                    done = self._settle_moved(e, now) if second else self._settle(e, now)
                except Exception as exc:  # its future fails with it
                    self.fail(e[0], exc, e[7])
                    continue
                if done is None:
                    moved.append(e)
                elif done:
                    settled += 1
                else:
                    rest.append(e)
        if settled:
            self._crowd = settled
        self._deferred[:0] = rest
        if self._deferred and not self._sweep_scheduled:
            self.call_soon(self.sweep)
            self._sweep_scheduled = True

    def flush_reads(self) -> None:
        """Every deferred read to the route (the server's close), or its buffer back on
        the spares when its future is done already (see ``_native_read.c``)."""
        old, self._deferred = self._deferred, []
        for e in old:
            fut = e[0]
            try:
                if fut.done():
                    self._pending_set.discard(fut)
                    e[8].append(e[1])
                else:
                    self._hand_over(e)
            except Exception as exc:
                self.fail(fut, exc, e[7])

    def set_write(self, small_writes: Any, small_max: Any, miss: Any) -> None:
        """What :meth:`write` needs (see ``_native_write.c``)."""
        from ...errors import InvalidArgument

        if not isinstance(small_max, int):
            raise TypeError(f"set_write's size must be an int, got {small_max!r}")
        if not isinstance(small_writes, dict) or small_max < 0 or not callable(miss):
            raise InvalidArgument(
                "set_write needs a dict of spare buffers, a size >= 0 and a callable"
            )
        self.small_writes, self.write_max, self.write_miss = small_writes, small_max, miss

    def write(self, item: Any, data: Any) -> bool:
        """A small write of ``bytes`` into ``item``, or False (see ``_native_write.c``)."""
        if self.small_writes is None or self.write_miss is None:
            return False
        try:
            p = self._plan_write(item, data)
            buf = None if p is None else self._spare_of(p)
        except Exception:  # the Python route meets (and raises) whatever stopped this one
            p = buf = None
        if p is None or buf is None:
            self.w_declined += 1
            return False
        stamp = self._commit(p)
        ctypes.memmove(buf.ptr, data, p.nbytes)
        try:
            err = _driver["d"].cuMemcpyHtoDAsync(p.ptrs[0], buf.ptr, p.nbytes, p.stream)[0]
            if err:
                raise self.error_from(err, "cuMemcpyHtoDAsync")
        except Exception as exc:  # held, the buffer tainted (as fire_writing does)
            self.hold(p.sid, exc, tuple(p.mids))
        self.small_writes[p.nbytes].append((buf, stamp))
        self.channel.ran_inline()  # as _native_fast.c's after()
        self.w_hits += 1
        return True

    @property
    def write_stats(self) -> tuple[int, int]:
        """Stats of :meth:`write`: (taken, left to the Python route)."""
        return self.w_hits, self.w_declined

    def _plan_write(self, item: Any, data: Any) -> _Plan | None:
        if type(item) is not self.handle_t and type(item) is not self.binding_t:
            return None
        if type(data) is not bytes:
            return None
        p = _Plan()
        if not self._channel_ready(p) or self.channel._held._tainted:
            return None  # a tainted buffer: the route's write clears its taint
        if not self._stream_of(p) or not self._pointers_of(p, [item]):
            return None
        if not 0 < p.nbytes <= self.write_max or p.nbytes != len(data):
            return None
        if not self._own_slot(p, [item]):
            return None
        p.stream = p.wrapper.stream
        return p

    def _passed(self, stamp: Any) -> bool:
        """The stream slot of ``stamp`` (sid, cursor) is done up to its cursor."""
        sid, cursor = stamp
        wrapper = self.slots[sid.value % self.max_streams]
        return wrapper is not None and wrapper.done >= cursor

    def _spare_of(self, p: _Plan) -> Any:
        """A staging buffer for ``p.nbytes`` the device is done with, taken off the
        server's list, or a new one from ``write_miss`` (None: the route stages it)."""
        spares = self.small_writes.get(p.nbytes)
        if spares is not None:
            for i, (buf, stamp) in enumerate(spares[:64]):
                if self._passed(stamp):
                    del spares[i]
                    return buf if buf.ptr and buf.size >= p.nbytes else None
        buf = self.write_miss(p.nbytes)
        if buf is None or type(self.small_writes.get(p.nbytes)) is not list:
            return None
        return buf if buf.ptr and buf.size >= p.nbytes else None

    def set_pointers(self, fn: Any) -> None:
        """``fn(binding)`` finds (and caches in ``addresses``) the address of a buffer no
        route has used yet; its errors leave the command to the route."""
        from ...errors import InvalidArgument

        if not callable(fn):
            raise InvalidArgument(f"set_pointers needs a callable, got {fn!r}")
        self.ptr_miss = fn

    def read(self, item: Any) -> Any:
        """A future of ``[bytes]`` for a small read of ``item``, or None (see fast.py)."""
        if self.small_reads is None:
            return None
        try:
            p = self._plan_read(item)
            spare = None if p is None else self.small_reads.get(p.nbytes)
            if p is not None and type(spare) is list and not spare and self._read_miss:
                buf = self._read_miss(p.nbytes)  # every spare is out: a new one, or None
                if buf is not None:
                    spare.append(buf)
        except Exception:  # the Python route meets (and raises) whatever stopped this one
            p = spare = None
        if p is None or type(spare) is not list or not spare:
            self._declined += 1
            return None
        fut = self._issue(p, spare, self._commit(p)[1])
        self.channel.ran_inline()  # as _native_fast.c's after()
        self._hits += 1
        return fut

    def _plan_read(self, item: Any) -> _Plan | None:
        return self._plan_one(item, self.small_max)

    def _plan_one(self, item: Any, most: int | None) -> _Plan | None:
        """A read's or an export's plan: one buffer of at most ``most`` bytes (None: any),
        no error held and no buffer tainted, the task's stream, its own slot."""
        if type(item) is not self.handle_t and type(item) is not self.binding_t:
            return None
        p = _Plan()
        held = self.channel._held
        if not self._channel_ready(p) or held._held or held._tainted:
            return None  # an error is held or a buffer tainted: the route raises it
        if not self._stream_of(p) or not self._pointers_of(p, [item]):
            return None
        if p.nbytes <= 0 or (most is not None and p.nbytes > most):
            return None
        if not self._own_slot(p, [item]):
            return None
        p.stream = p.wrapper.stream
        return p

    def export(self, item: Any, consumer: Any, event: Any) -> int | None:
        """A DLPack export's ordering: ``item``'s address, its buffer stamped on the
        task's stream, ``event`` recorded there and ``consumer`` made to wait for it; or
        None (see ``_native_write.c``)."""
        from ...errors import InvalidArgument

        consumer = _u64(consumer, "export's consumer stream")
        event = _u64(event, "export's event")
        if not consumer or not event:
            raise InvalidArgument("export needs a consumer stream and an event, not a null handle")
        try:
            p = self._plan_one(item, None)
        except Exception:  # the Python route meets (and raises) whatever stopped this one
            p = None
        if p is None:
            self.x_declined += 1
            return None
        self._commit(p)
        d = _driver["d"]
        what, err = "cuEventRecord", d.cuEventRecord(event, p.stream)[0]
        if not err:
            what, err = "cuStreamWaitEvent", d.cuStreamWaitEvent(consumer, event, 0)[0]
        if err:
            raise self.error_from(err, what)
        self.channel.ran_inline()  # as _native_fast.c's after()
        self.x_hits += 1
        return int(p.ptrs[0])

    @property
    def export_stats(self) -> tuple[int, int]:
        """Stats of :meth:`export`: (taken, left to the Python route)."""
        return self.x_hits, self.x_declined

    def _issue(self, p: _Plan, spare: list[Any], cursor: int) -> Any:
        buf = spare.pop()
        host = buf.ptr
        fut = self.create_future()
        err = _driver["d"].cuMemcpyDtoHAsync(host, p.ptrs[0], p.nbytes, p.stream)[0]
        if err:
            spare.append(buf)
            self.fail(fut, self.error_from(err, "cuMemcpyDtoHAsync"))
        elif self._should_defer(p):
            self._defer(p, spare, buf, cursor, fut)
        elif self._spun(p.stream) == 1:
            # the copy was the stream's last work: marked done up to it, as a sync marks it
            if p.wrapper.done < cursor:
                p.wrapper.done = cursor
            data = [ctypes.string_at(host, p.nbytes)]
            _keep_spare(spare, buf)
            fut.set_result(data)
        else:
            self.later(p.sid, p.stream, buf, p.nbytes, fut)
        return fut

    @property
    def stats(self) -> tuple[int, int]:
        """(launches taken, launches left to the Python route)."""
        return self._hits, self._declined

    def __call__(self, kernel: Any, count: Any, bindings: Any, mode: Any) -> bool:
        return self._take(False, kernel, count, bindings, mode, None)

    def queued(self, kernel: Any, count: Any, bindings: Any, mode: Any, sid: Any) -> bool:
        """The launch as the actor runs it from its queue, on the StreamId it was sent
        with: the same route without the caller's checks or ``ran_inline`` (see fast.py)."""
        return self._take(True, kernel, count, bindings, mode, sid)

    def _take(self, queued: bool, kernel: Any, count: Any, bindings: Any, mode: Any,
              sid: Any) -> bool:  # fmt: skip
        """As _native_fast.c's take(): plan, then launch, or leave it to the route."""
        try:
            if queued:
                p = self._plan_queued(kernel, count, bindings, mode, sid)
            else:
                p = self._plan(kernel, count, bindings, mode)
        except Exception:  # the Python route meets (and raises) whatever stopped this one
            p = None
        if p is None:
            if queued:
                self._q_declined += 1
            else:
                self._declined += 1
            return False
        self._commit(p)
        self._run(p, kernel)
        if queued:
            self._q_hits += 1
        else:
            self.channel.ran_inline()  # as _native_fast.c's after()
            self._hits += 1
        return True

    @property
    def queued_stats(self) -> tuple[int, int]:
        """Stats of :meth:`queued`: (taken, left to the Python route)."""
        return self._q_hits, self._q_declined

    def _types_ok(self, kernel: Any, count: Any, bindings: Any, mode: Any) -> bool:
        return (
            type(kernel) is self.kernel_t
            and type(count) is self.count_t
            and type(bindings) is self.bindings_t
            and type(mode) is self.mode_t
        )

    def _plan(self, kernel: Any, count: Any, bindings: Any, mode: Any) -> _Plan | None:
        if not self._types_ok(kernel, count, bindings, mode):
            return None
        p = _Plan()
        if not self._channel_ready(p) or not self._stream_of(p):
            return None
        return self._plan_launch(p, kernel, count, bindings, mode)

    def _plan_queued(
        self, kernel: Any, count: Any, bindings: Any, mode: Any, sid: Any
    ) -> _Plan | None:
        if not self._types_ok(kernel, count, bindings, mode) or not self._device_ready():
            return None
        p = _Plan()
        p.sid = sid
        return self._plan_launch(p, kernel, count, bindings, mode)

    def _plan_launch(
        self, p: _Plan, kernel: Any, count: Any, bindings: Any, mode: Any
    ) -> _Plan | None:
        if count.binding is not None or len(bindings.tensor_maps) != 0:
            return None
        if self.channel._held._tainted:  # the route clears the taints of its buffers
            return None
        loaded = self.kernels.get(kernel.id)
        if loaded is None or not self._pointers_of(p, bindings.buffers):
            return None
        if not self._pack_of(p, loaded, bindings):
            return None
        p.grid = (count.x, count.y, count.z)
        if mode is self.checked and loaded.grid_ok != p.grid:
            return None
        p.shape = loaded.shape
        p.function = loaded.function
        if not self._own_slot(p, bindings.buffers):
            return None
        p.stream = p.wrapper.stream
        return p

    def _device_ready(self) -> bool:
        c = self.channel
        if c.state is not self.open_state or c.guard is not None:
            return False
        if self.recorder.enabled is not False or not _need_driver_open():
            return False
        # as driver.set_current last made it on this thread (the route's activate())
        return getattr(self.tls, "context", None) is self.context

    def _channel_ready(self, p: _Plan) -> bool:
        if not self._device_ready():
            return False
        if self.get_loop() is not self.loop and (
            self.on_loop is None or self.on_loop() is not True
        ):
            return False
        c = self.channel
        if c._stop is not False:
            return False
        n = len(c._queue)
        if n == 0:
            return c._wakeup is not None
        fp = self._footprint
        if fp is None or c._blocked is not False or fp.queued != n:
            return False
        p.ahead = True  # every queued command tracked: checked against its slot and buffers
        return True

    def _clear_of(self, p: _Plan, mids: Any) -> bool:
        """Nothing queued is on the stream ``p.sid`` or binds one of ``mids`` (when
        commands are queued)."""
        if not p.ahead:
            return True
        fp = self._footprint
        if p.sid.value in fp.streams:
            return False
        buffers = fp.buffers
        return not any(m in buffers for m in mids)

    def _stream_of(self, p: _Plan) -> bool:
        pinned = self.pinned.get()
        if pinned is not None:
            p.sid = pinned
            return True
        owned = self.owned.get()
        if owned is None:
            p.sid = self.current_sid()
            return True
        task = self.task_fn() if self.task_arg is None else self.task_fn(self.task_arg)
        owner = owned[0]
        if task is None or isinstance(owner, int):
            return False
        # a task's first command: StreamId.current() mints its stream, as the route would
        p.sid = owned[1] if owner() is task else self.current_sid()
        return True

    def _pointers_of(self, p: _Plan, buffers: Any) -> bool:
        queue = self.table.queue
        if type(buffers) is not list or len(buffers) > _MAX_BUFFERS:  # as the C module
            return False
        p.mids, p.ptrs = [], []
        addresses = self.addresses
        for b in buffers:
            token = b.memory
            mid = token.id
            entry = addresses.get(mid)
            if entry is None and self.ptr_miss is not None and token.queue is queue:
                self.ptr_miss(b)  # a new handle: found and cached (raises: the route)
                entry = addresses.get(mid)
            start = b.offset_start or 0
            if (
                entry is None
                or token.queue is not queue
                or not 0 <= start <= b.buffer_size - (b.offset_end or 0) <= entry[1]
            ):
                return False
            p.mids.append(mid)
            p.ptrs.append(entry[0] + start)
            p.nbytes = b.buffer_size - (b.offset_end or 0) - start
        return True

    def _pack_of(self, p: _Plan, loaded: Any, bindings: Any) -> bool:
        scalars = bindings.scalars
        if type(scalars) is not dict or len(scalars) > _MAX_SCALAR_GROUPS:
            return False
        p.meta = bindings.metadata.data
        if scalars:  # in ABI order (ArgPacker's), as _native_plan.c's pack_of puts them
            groups = list(scalars.values()) if len(scalars) == 1 else bindings.ordered_scalars()
            skey: tuple[Any, ...] = tuple([(sb.ty.num, sb.length) for sb in groups])
            p.scalar = [sb.data for sb in groups]
        else:
            skey, p.scalar = (), None
        pack = self.packs.get((len(p.ptrs), 0, skey, p.meta.size))
        if pack is None or pack not in loaded.checked:
            return False
        p.pack = pack.state
        return True

    def _own_slot(self, p: _Plan, buffers: list[Any]) -> bool:
        m = self.max_streams
        own = p.sid.value % m
        last_use = self.last_use
        for mid, b in zip(p.mids, buffers, strict=True):
            origin = last_use.get(mid)
            if (b.stream if origin is None else origin[0]).value % m != own:
                return False
        return self._clear_of(p, p.mids) and self._wrapper_of(p, own)

    def _wrapper_of(self, p: _Plan, own: int) -> bool:
        p.wrapper = self.slots[own]
        if p.wrapper is None:  # the stream's first operation: created as resolve would
            p.wrapper = self.get_index(own)
        return p.wrapper is not None

    @staticmethod
    def _new_plan() -> _Plan:
        return _Plan()

    def _commit(self, p: _Plan) -> tuple[Any, int]:
        cursor = p.wrapper.cursor = p.wrapper.cursor + 1
        stamp = (p.sid, cursor)
        last_use = self.last_use
        for mid in p.mids:
            last_use[mid] = stamp
        return stamp

    def _run(self, p: _Plan, kernel: Any) -> None:
        gx, gy, gz = p.grid
        if not (gx and gy and gz):
            return
        try:
            meta = p.meta if p.meta.size else None
            scalars = p.scalar
            if p.pack.scalars and scalars is None:
                scalars = []  # fill() then names the missing group
            bx, by, bz, smem = p.shape
            err = launch(
                p.pack, p.function, gx, gy, gz, bx, by, bz, smem, p.stream, p.ptrs, scalars,
                meta, None,
            )  # fmt: skip
            if err:
                raise self.error_from(err, f"cuLaunchKernel({kernel.id})")
        except Exception as exc:  # held, the launch's buffers tainted (Launcher.launch)
            self.hold(p.sid, exc, tuple(p.mids))


def _keep_spare(spare: list[Any], buf: Any) -> None:
    """A read's buffer back on its size's spares (as transfers.keeps_read_spare), else
    released."""
    kept, nbytes = len(spare), buf.size
    if kept < 4 or (kept < _READ_SPARES and (kept + 1) * nbytes <= _READ_SPARE_BYTES):
        spare.append(buf)
    else:
        buf.release()


def _spin(stream: Any, seconds: float) -> int:
    """Poll ``stream`` until its work is done (1), ``seconds`` passed (0) or it failed
    (-1)."""
    end = time.perf_counter() + seconds
    query = _driver["d"].cuStreamQuery
    while True:
        q = int(query(stream)[0])
        if q == 0:
            return 1
        if q != _NOT_READY:
            return -1  # later() raises it, as the route
        if time.perf_counter() >= end:
            return 0


def _need_driver_open() -> bool:
    try:
        _need_driver()
    except RuntimeError:
        return False
    return True
