"""The collectives over NCCL between CUDA servers of distinct devices (one process):
``all_reduce``, ``broadcast``, ``all_gather`` and ``reduce_scatter``.

One communicator set per set of servers (``ncclCommInitAll`` over their devices, in a
worker thread: it blocks), cached, and destroyed when any of those servers closes (its
close thread runs :data:`close hooks <CLOSE_HOOKS>`), or at exit. Each server's side
is resolved the way a kernel's is (:meth:`prepare`: its stream waits for the buffers'
earlier work on other streams); the calls of all devices are then issued at once
under ``ncclGroupStart``/``ncclGroupEnd`` (:func:`group`), each on its server's stream,
so later work queued on those streams runs after them; each buffer is held until its
stream passes the collective (:func:`finish`).

A set's NCCL calls (the group, the collectives; its destruction) run on the set's own
issue thread (:class:`IssueThread`): NCCL connects lazily at a communicator's first
collective of a kind, loads its kernels, allocates, and blocks while its launch queues
are full (the first group of a kind took 9-45 ms on two H100s). One thread per set
keeps the calls on a communicator in the order they were submitted, as NCCL requires.
The hop to that thread and back costs more than the group itself once NCCL is warm
(~20 µs a group, against ~200 µs of wake-ups on the GPU machine), so a kind of call
(:meth:`Comms.inline`'s key: the collective, its type, operation and size class) whose
last group ran in under :data:`INLINE_BELOW` is issued on the caller's thread, while
the issue thread has nothing queued (the order stays the order of submission); an
inline group that takes longer sends its kind back to the thread.
"""

from __future__ import annotations

import _thread
import atexit
import queue
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..errors import CollectiveError
from ..values.stream_id import StreamId
from ..values.types import Binding
from . import nccl
from .driver import adopt_current, forget_current

if TYPE_CHECKING:
    from .server import CudaServer

__all__ = [
    "Comms",
    "IssueThread",
    "all_gather",
    "broadcast",
    "cached",
    "finish",
    "group",
    "init_job",
    "issue",
    "prepare",
    "reduce_scatter",
]

Side = tuple[Any, ...]
"""One server's side: (the device address of its first buffer, the server's CUDA stream
for the caller's stream, then the addresses of its other buffers, in order)."""

Call = Callable[[Any, int, Side], None]
"""One rank's NCCL call: ``(library, communicator, side)``."""

Work = tuple[Callable[[], None], Callable[[BaseException | None], None]]

INLINE_BELOW = 250e-6
"""A kind of call whose last group took less (seconds) is issued on the caller's
thread (see above): well below the loop-lag budget of a service (1 ms at p99)."""


class IssueThread:
    """A communicator set's thread: runs submitted NCCL work one at a time, in order.

    Started by the first :meth:`submit` without waiting for it (``_thread``, not
    ``threading.Thread.start``, which waits on the calling thread); each work's outcome
    goes to its ``done`` callback, on this thread (the caller hands it back to its loop).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._started = False
        self._closed = False
        self._pending = 0

    def idle(self) -> bool:
        """Nothing submitted is still to run (its ``done`` may still be on its way)."""
        return self._pending == 0

    def submit(
        self, call: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        """Run ``call`` after the work submitted before, then ``done(error or None)``.
        Raises :class:`CollectiveError` once the set is destroyed (nothing runs)."""
        with self._lock:
            if self._closed:
                raise CollectiveError(
                    "the NCCL communicators of these clients were destroyed (one of the "
                    "clients closed); the collective did not run"
                )
            if not self._started:
                self._started = True
                _thread.start_new_thread(self._run, ())
            self._pending += 1
            self._queue.put((call, done))

    def close(self) -> None:
        """Refuse new work and wait until the submitted work has run (blocking)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
            if started:
                self._queue.put(None)
        if started:
            self._ended.wait()

    def _run(self) -> None:
        try:
            while (work := self._queue.get()) is not None:
                call, done = work
                del work
                error: BaseException | None = None
                try:
                    call()
                except BaseException as exc:
                    error = exc
                with self._lock:
                    self._pending -= 1
                try:
                    done(error)
                except BaseException:  # the caller's hand-back failed: the later work
                    pass  # still runs (a dead thread would leave every later call waiting)
                del call, done, error
        finally:
            self._ended.set()


class Comms:
    """The communicators of one set of servers: the library, one per server (the rank
    of a server is its place in the set), and the set's :class:`IssueThread`."""

    def __init__(self, lib: Any, servers: Sequence[Any], comms: list[int]) -> None:
        self.lib = lib
        self._servers = [weakref.ref(s) for s in servers]
        self.by_server = {id(s): c for s, c in zip(servers, comms, strict=True)}
        self.contexts = tuple(
            c
            for c in (getattr(getattr(s, "context", None), "context", None) for s in servers)
            if c is not None
        )
        """The servers' contexts, one of which NCCL leaves current after a group."""
        self.destroyed = False
        self.thread = IssueThread()
        self._fast: set[Hashable] = set()
        """The kinds of call whose last group took less than :data:`INLINE_BELOW`."""
        self._inline = threading.Lock()
        """Held by a group run on the caller's thread, and by :meth:`destroy` while it
        frees the communicators."""

    def serves(self, servers: Sequence[Any]) -> bool:
        """True while these exact servers are the ones it was made for."""
        return not self.destroyed and [r() for r in self._servers] == list(servers)

    def submit(
        self, call: Callable[[], None], done: Callable[[BaseException | None], None]
    ) -> None:
        """Run ``call`` (NCCL calls on these communicators) on the set's issue thread,
        after the calls submitted before; see :meth:`IssueThread.submit`."""
        self.thread.submit(call, done)

    def inline_ready(self, key: Hashable | None) -> bool:
        """True when a group of kind ``key`` would run on the caller's thread now (see
        :meth:`run_inline`, which may still decline: the set destroyed meanwhile)."""
        return key in self._fast and not self.destroyed and self.thread.idle()

    def run_inline(self, key: Hashable | None, call: Callable[[], None]) -> bool:
        """Run ``call`` (a group of kind ``key``) on the caller's thread, if it may run
        there now: its kind's last group was fast, the issue thread has nothing queued,
        and the set is not being destroyed. False: not run (submit it instead; a
        destroyed set's thread refuses it, saying so). ``call``'s error is raised."""
        if key not in self._fast or not self.thread.idle():
            return False
        if not self._inline.acquire(blocking=False):  # being destroyed: never wait
            return False
        try:
            if self.destroyed:
                return False
            start = perf_counter()
            try:
                call()
            finally:
                self.timed(key, perf_counter() - start)
            return True
        finally:
            self._inline.release()

    def timed(self, key: Hashable | None, seconds: float) -> None:
        """Record how long a group of kind ``key`` took (any thread)."""
        if key is None:
            return
        if seconds < INLINE_BELOW:
            self._fast.add(key)
        else:
            self._fast.discard(key)

    def destroy(self) -> None:
        """Free every communicator (once; blocking: the close thread, or exit), after
        the work already submitted has run; later submits are refused."""
        if self.destroyed:
            return
        self.destroyed = True
        self.thread.close()
        first: BaseException | None = None
        with self._inline:  # a group running on the caller's thread ends first
            for comm in self.by_server.values():
                try:
                    self.lib.comm_destroy(comm)
                except Exception as exc:  # free the others still; the first is raised
                    first = first or exc
        if first is not None:
            raise first


_lock = threading.Lock()
_cache: dict[tuple[int, ...], Comms] = {}
_exit_registered: list[bool] = []


def _key(servers: Sequence[Any]) -> tuple[int, ...]:
    return tuple(id(s) for s in servers)


def cached(servers: Sequence[Any]) -> Comms | None:
    """The communicators made for ``servers`` (in this order), or None."""
    comms = _cache.get(_key(servers))
    return comms if comms is not None and comms.serves(servers) else None


def init_job(path: str, servers: Sequence[CudaServer], loader: Any = None) -> Callable[[], Comms]:
    """A job (for a worker thread) that loads NCCL from ``path`` (``loader``: tests'
    fake) and makes one communicator per server's device, cached for ``servers``."""
    load = nccl.load if loader is None else loader
    devices = [s.context.ordinal for s in servers]

    def job() -> Comms:
        with _lock:
            comms = cached(servers)
            if comms is not None:
                return comms
            lib = load(path)
            try:
                made = Comms(lib, servers, lib.comm_init_all(devices))
            finally:
                forget_current()  # NCCL made each device current in this thread
            _cache[_key(servers)] = made
            for server in servers:
                server.close_hooks.append(_forget_hook(made))
            if not _exit_registered:
                _exit_registered.append(True)
                atexit.register(destroy_all)
            return made

    return job


def _forget_hook(comms: Comms) -> Callable[[], None]:
    def hook() -> None:
        with _lock:
            for key, value in list(_cache.items()):
                if value is comms:
                    del _cache[key]
        comms.destroy()

    return hook


def destroy_all() -> None:
    """Free every cached communicator (at exit)."""
    with _lock:
        every = list(_cache.values())
        _cache.clear()
    for comms in every:
        try:
            comms.destroy()
        except Exception:  # at exit: the driver may be gone already; nothing to do
            pass


def prepare(server: CudaServer, bindings: Sequence[Binding], stream: StreamId) -> Side:
    """One server's side, issued like a kernel binding ``bindings``: the first buffer's
    address, the server's stream for ``stream`` (made to wait for the buffers' work on
    other streams), then the other buffers' addresses."""
    ptrs = [server._ptr(b) for b in bindings]
    resolved = server._streams.resolve(stream, list(bindings))
    return (ptrs[0], resolved.stream, *ptrs[1:])


def group(comms: Comms, calls: Sequence[tuple[Any, Side, Call]]) -> None:
    """Every rank's call in one NCCL group: ``calls`` gives each server its
    :func:`prepare` result and its call. The group is always closed; the first failure
    is raised (:class:`~asynccube.CollectiveError`, NCCL's words). Run it on the set's
    issue thread (:meth:`Comms.submit`), or in place (:meth:`Comms.run_inline`).

    No context is made current for a call: NCCL's group calls need none ("no need to set
    the CUDA device before every NCCL communication call within a group": each
    communicator of ``ncclCommInitAll`` knows its device, and NCCL makes each device
    current itself). It then makes the device current before the group current again
    (on success, in the versions read): the context current afterwards is asked of the
    driver, not assumed (:func:`.driver.adopt_current`)."""
    lib = comms.lib
    lib.group_start()
    failed: BaseException | None = None
    try:
        for server, side, call in calls:
            call(lib, comms.by_server[id(server)], side)
    except BaseException as exc:
        failed = exc
    try:
        lib.group_end()
    except BaseException as exc:
        forget_current()  # a failed group may leave any device current
        if failed is None:
            raise
        failed.add_note(f"and then ncclGroupEnd failed: {exc}")
    else:
        adopt_current(comms.contexts)  # NCCL made each device current in turn
    if failed is not None:
        forget_current()
        raise failed


def issue(comms: Comms, sides: Sequence[tuple[Any, Side]], count: int, dtype: str, op: str) -> None:
    """Every device's ``ncclAllReduce`` of ``count`` elements (in place), in one group:
    ``sides`` pairs each server with its :func:`prepare` result (see :func:`group`)."""
    code, reduce_op = nccl.DTYPES[dtype], nccl.OPS[op]

    def call(lib: Any, comm: int, side: Side) -> None:
        lib.all_reduce(side[0], count, code, reduce_op, comm, int(side[1]))

    group(comms, [(server, side, call) for server, side in sides])


def broadcast(comms: Comms, sides: Sequence[tuple[Any, Side]], nbytes: int, root: int) -> None:
    """Every device's ``ncclBroadcast`` of the first ``nbytes`` of rank ``root``'s buffer
    into each rank's (in place: send = receive buffer), in one group."""
    code = nccl.DTYPES["uint8"]

    def call(lib: Any, comm: int, side: Side) -> None:
        lib.broadcast(side[0], side[0], nbytes, code, root, comm, int(side[1]))

    group(comms, [(server, side, call) for server, side in sides])


def all_gather(comms: Comms, sides: Sequence[tuple[Any, Side]], nbytes: int) -> None:
    """Every device's ``ncclAllGather`` of ``nbytes`` per rank (side: input, then
    output), in one group: rank i's input lands at ``i * nbytes`` of every output."""
    code = nccl.DTYPES["uint8"]

    def call(lib: Any, comm: int, side: Side) -> None:
        lib.all_gather(side[0], side[2], nbytes, code, comm, int(side[1]))

    group(comms, [(server, side, call) for server, side in sides])


def reduce_scatter(
    comms: Comms, sides: Sequence[tuple[Any, Side]], count: int, dtype: str, op: str
) -> None:
    """Every device's ``ncclReduceScatter`` of ``count`` elements per rank (side: input,
    then output), in one group: rank i's output is the reduction of every input's i-th
    chunk of ``count`` elements."""
    code, reduce_op = nccl.DTYPES[dtype], nccl.OPS[op]

    def call(lib: Any, comm: int, side: Side) -> None:
        lib.reduce_scatter(side[0], side[2], count, code, reduce_op, comm, int(side[1]))

    group(comms, [(server, side, call) for server, side in sides])


def finish(server: CudaServer, side: Side, bindings: Sequence[Binding]) -> None:
    """After the group: the buffers stay alive until their stream passes the collective."""
    for binding in bindings:
        server._retirer.hold(side[1], binding)
