"""Warm-up runs: the client's two scopes (cubecl-runtime's ``dry_run`` module: ``DryRun``
and ``RealRun``), with their statistics.

``async with client.warm_up() as stats:`` drops the launches of the task that opened it
(and of the tasks it starts inside the block) on this client: each is checked as a
launch is, its kernel compiled and loaded (CUDA: NVRTC through the cubin caches, then
the module load, in worker threads shared by the scope's kernels, never on the loop;
the host server only checks), and nothing runs. Creates, writes and reads are real: a
handler runs unchanged, its buffers come from the pools as they will when it serves.
The buffers made during the scope that a dropped launch binds (a kernel may write any
buffer it binds) carry a :class:`LaunchDropped` failure (the error graph of
:mod:`..channel.held`): a read of one raises it, inside the scope or after, never bytes
that are not a result; a later write clears it. Buffers made before the scope (weights,
long-lived state) are left as they were: no launch changed them, so their bytes are
true (each buffer's id says which: handles are numbered in the order they are made,
``handle_watermark``). A read of a
dropped result is where a warm-up pass of a handler ends, so the scope absorbs a
``LaunchDropped`` that leaves its block, clearing the locals of the ended frames it passed
through: the pass's buffers are dropped then, and collected with their taints before the
scope ends (while a buffer carries a failure the one-call routes decline, so the first
request after a warm-up takes the routes its hundredth takes). Tuners inside do not
measure (nothing runs): for a key not tuned yet they run every candidate once, so every
candidate's kernels compile; for a tuned key, the pick.

``async with client.tuning() as stats:`` runs the launches, and makes every tuner call
of the task tune its key now (a background tuner waits for it too), so that later calls
find the pick; it is the measuring scope (``RealRun``), and inside a warm-up it runs the
launches again. A tuner's own measurements always run, whatever scope its caller is in.

When a scope ends normally, the actor has reached every launch it dropped (a launch
queued behind other commands is counted then), everything it started is finished (each
kernel compiled and loaded, each tuning run done and stored) and ``stats`` is final;
a warm-up scope then waits, without blocking the loop, for the device to pass the work
queued so far, and collects what that frees (:meth:`WarmUp.settle`: a pass's write
staging and dropped slices, held until then, are where the first request finds them,
as the hundredth does). Kernels that
failed are named in ``stats.failures`` and, unless ``raise_on_failure=False``, by a
:class:`WarmUpError` raised there. No failure is held on a stream: a later launch of a
kernel that failed compiles it again. When the block raises (or is cancelled), the
scope ends at once: what it dropped stays dropped, and the compiles it started finish
in their threads without being awaited.

A scope belongs to its task through a context variable: another task's launches on the
same client run as usual while it is open, and a task it started that outlives it is
not in it any more. A scope is entered once. While a warm-up scope is open, the client's
one-call launch routes step aside for every task (a guard on the channel), so each
launch is routed by the scope of the task that makes it.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..channel.channel import Channel, State
from ..channel.held import detach_frames
from ..errors import InvalidArgument, LaunchDropped, WarmUpError
from ..server.preparation import CACHE_ORIGINS, KernelPrepared
from ..server.protocol import ComputeServer
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import ExecutionMode
from .jobs import JobThread
from .launch import written_by

__all__ = ["Scope", "WarmUp", "WarmUpStats", "current_scope", "leave_scopes"]

_SCOPES: ContextVar[tuple[Scope, ...]] = ContextVar("asynccube_warm_up_scopes", default=())
"""The scopes open in the calling task's context, innermost last."""

_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Worker threads compiling a client's warm-up kernels side by side."""


@dataclass
class WarmUpStats:
    """What a warm-up or tuning scope did; final once the scope has ended normally.

    Kernels are counted once per scope each, by their id; tuning outcomes once per
    tuner and key.

    Attributes:
        launches: Launches the scope dropped (``warm_up`` only).
        kernels: Distinct kernels those launches named.
        compiled: Kernels compiled (NVRTC ran) and loaded.
        from_cache: Kernels whose cubin came from the compile cache (memory or disk),
            then loaded.
        already_loaded: Kernels the server had loaded before (on the host server every
            kernel: numpy compiles nothing).
        stored: Compiled kernels written to the disk cache.
        failures: Kernel id -> the error its checks, compile or load raised.
        tuned: Tuner keys measured during the scope (``tuning`` only).
        tune_cached: Tuner keys whose pick was known (memory, disk, a single
            implementation).
        tune_stored: Tuning results written to the autotune disk cache.
        tune_failures: ``"tuner key"`` -> the error of its tuning (every implementation
            failed), or of a candidate a warm-up ran.
    """

    launches: int = 0
    kernels: int = 0
    compiled: int = 0
    from_cache: int = 0
    already_loaded: int = 0
    stored: int = 0
    failures: dict[str, BaseException] = field(default_factory=dict)
    tuned: int = 0
    tune_cached: int = 0
    tune_stored: int = 0
    tune_failures: dict[str, BaseException] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        """How many kernels failed (``len(failures)``)."""
        return len(self.failures)


class _Prep:
    """One kernel's compile-and-load job, shared by the scopes that wait for it."""

    __slots__ = ("future", "kernel_id", "outcome")

    def __init__(self, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self.future: Awaitable[None] | None = None
        self.outcome: KernelPrepared | BaseException | None = None


class WarmUp:
    """A client's warm-up part: the warm-up scopes open on it, the kernel jobs in flight
    and the worker threads that run them (see the module docstring)."""

    __slots__ = ("_channel", "_dropping", "_hook", "_next", "_threads", "_watermark", "inflight")

    def __init__(self, server: ComputeServer, channel: Channel) -> None:
        self._channel = channel
        self._hook: Callable[..., Callable[[], KernelPrepared] | None] | None = getattr(
            server, "warm_up_launch", None
        )
        self._watermark: Callable[[], int] | None = getattr(server, "handle_watermark", None)
        self._dropping = 0
        """Warm-up scopes open on this client (the channel's guard is set while > 0)."""
        self.inflight: dict[str, _Prep] = {}
        self._threads: list[JobThread] = []
        self._next = 0

    def launch_for(self, launch: Any) -> Any:
        """The op ``execute`` sends: the calling task's warm-up scope's, or ``launch``."""
        if not self._dropping:
            return launch
        scope = current_scope(self)
        return launch if scope is None or not scope.dropping else scope.launch

    def opened(self) -> None:
        """A warm-up scope opened: the one-call routes step aside (see above)."""
        self._dropping += 1
        if self._dropping == 1:
            self._channel.add_guard(self._guard)

    def closed(self) -> None:
        """A warm-up scope ended; with the last, the routes come back and the worker
        threads end once their queued jobs are done."""
        self._dropping -= 1
        if not self._dropping:
            self._channel.remove_guard(self._guard)
            threads, self._threads = self._threads, []
            for thread in threads:
                thread.close()

    async def reached(self) -> None:
        """Return once the actor has run every command sent so far, then collected the
        buffers dropped so far (the server's ``end_batch``). A dropped launch is counted
        (and its kernel's job started) when the actor reaches it, and one the channel
        queued (behind another command, or past the loop iteration's budget: a GPU
        server's creates often are) may not have been reached when its scope ends. The
        collection forgets the :class:`LaunchDropped` taints of the scope's buffers that
        are gone: while any buffer carries a failure, the servers' one-call routes
        decline, and the first request after a warm-up would take the slow routes."""
        channel = self._channel
        if channel.state is State.OPEN:
            await channel.request(_reached, channel)

    async def settle(self) -> None:
        """Return once the device has passed the work queued so far (a sync that raises
        nothing: an error held for a stream stays held for its next awaited command),
        then collected what that releases (the server's ``end_batch``). A warm-up pass's
        creates and writes are real, and what they took stays taken until the device
        passes them: the staging buffer of a write (held until its copy is done), the
        slice of a buffer dropped after its last use, a stream's done mark. Left for the
        first request, they made it take the slow routes (its allocation and write
        through the route, a retirer poll) and the next allocate page-locked memory
        (``cuMemHostAlloc``, 100s of µs): the first request after a warm-up finds what
        the hundredth finds. The compiles the scope waited for took far longer than the
        device needs, so this rarely waits at all."""
        channel = self._channel
        if channel.state is State.OPEN:
            await channel.request(_settle, channel, StreamId.current())

    def watermark(self) -> int:
        """An id below that of every buffer made from now on (0: every buffer)."""
        return 0 if self._watermark is None else self._watermark()

    def _guard(self, op: str) -> None:
        """The channel's guard while a warm-up scope is open: it refuses nothing (its
        presence makes the one-call routes decline, so ``execute`` sees the scope)."""

    def prepare(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> _Prep | None:
        """The job preparing ``kernel`` (on the actor, in stream order): the one in
        flight, or a new one from the server's hook (its checks raise as the launch's
        would); None when there is nothing to prepare."""
        prep = self.inflight.get(kernel.id)
        if prep is not None or self._hook is None:
            return prep
        job = self._hook(kernel, count, bindings, mode, stream)
        if job is None:
            return None
        prep = self.inflight[kernel.id] = _Prep(kernel.id)
        prep.future = self._thread().run(self._runner(prep, job))
        return prep

    def _runner(self, prep: _Prep, job: Callable[[], KernelPrepared]) -> Callable[[], None]:
        inflight = self.inflight

        def run() -> None:  # in a worker thread; never raises (nobody may await it)
            try:
                prep.outcome = job()
            except BaseException as exc:
                detach_frames(exc, "raised while a warm-up scope compiled and loaded it")
                prep.outcome = exc
            finally:
                if inflight.get(prep.kernel_id) is prep:
                    del inflight[prep.kernel_id]

        return run

    def _thread(self) -> JobThread:
        threads = self._threads
        if len(threads) < _THREADS:
            threads.append(JobThread(self._channel.loop))
            return threads[-1]
        self._next = (self._next + 1) % len(threads)
        return threads[self._next]


class Scope:
    """``client.warm_up()`` (``dropping``) or ``client.tuning()``: an async context
    manager that gives its :class:`WarmUpStats` (see the module docstring)."""

    __slots__ = (
        "_ended",
        "_first",
        "_part",
        "_preps",
        "_raise",
        "_seen",
        "_tuned",
        "_tunings",
        "dropping",
        "stats",
    )

    def __init__(self, part: WarmUp, *, dropping: bool, raise_on_failure: bool) -> None:
        self._part = part
        self.dropping = dropping
        self._raise = raise_on_failure
        self.stats = WarmUpStats()
        self._preps: list[_Prep] = []
        self._seen: set[str] = set()
        self._tuned: set[str] = set()
        self._tunings: list[Awaitable[Any]] = []
        self._first = 0
        """The id of the first buffer made during the scope (older ones stay clean)."""
        self._ended = False
        """True once the scope ended (a task it started that outlives it is not in it)."""

    def __repr__(self) -> str:
        kind = "warm_up" if self.dropping else "tuning"
        return f"<{kind} scope: {self.stats}>"

    async def __aenter__(self) -> WarmUpStats:
        self._part._channel.check()  # an open client, on its own loop
        if self._ended or self in _SCOPES.get():
            raise InvalidArgument(
                "a warm-up or tuning scope is entered once: call client.warm_up() (or "
                "client.tuning()) again for another one"
            )
        _SCOPES.set((*_SCOPES.get(), self))
        if self.dropping:
            self._first = self._part.watermark()
            self._part.opened()
        return self.stats

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        _SCOPES.set(tuple(s for s in _SCOPES.get() if s is not self))
        self._ended = True
        if self.dropping:
            self._part.closed()
        absorbed = exc is not None and _only_dropped(exc)
        if exc is not None and not absorbed:
            return False  # ends at once: the jobs started finish in their threads
        if exc is not None:  # absorbed
            _clear_ended_frames(exc)  # the pass's buffers go now, with their taints
        if self.dropping:
            await self._part.reached()
        await self._finish()
        if self.dropping:
            await self._part.settle()
        if self.stats.failures and self._raise:
            raise _warm_up_error(self.stats.failures)
        return absorbed

    # -- the actor's half of a dropped launch ------------------------------------------

    def launch(
        self,
        stream: StreamId,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
    ) -> None:
        """Drop a launch (on the actor, in stream order): prepare its kernel, and taint
        the buffers it binds that were made during the scope with :class:`LaunchDropped`
        (a kernel may write any buffer it binds)."""
        self.stats.launches += 1
        first = kernel.id not in self._seen
        if first:
            self._seen.add(kernel.id)
            self.stats.kernels += 1
        try:
            prep = self._part.prepare(kernel, count, bindings, mode, stream)
        except Exception as exc:
            detach_frames(exc, "raised by a launch a warm-up scope checked")
            self.stats.failures.setdefault(kernel.id, exc)
            prep = None
        else:
            if prep is None and first:
                self.stats.already_loaded += 1
            elif prep is not None and first:
                self._preps.append(prep)
        made = self._first  # buffers made before the scope are left as they were
        written = [b for b in written_by(bindings) if b.memory.id >= made]
        if written:
            self._part._channel.taint(stream, written, _dropped(kernel))

    # -- tuners (tune/tuner.py) ---------------------------------------------------------

    def tuning_outcome(self, what: str, outcome: str, error: BaseException | None = None) -> None:
        """A tuner's outcome for ``what`` (``"tuner key"``): ``"tuned"``, ``"cached"``,
        ``"stored"`` or ``"failed"`` (with ``error``); each key's first counts."""
        if outcome == "stored":
            self.stats.tune_stored += 1
            return
        if what in self._tuned:
            return
        self._tuned.add(what)
        if outcome == "tuned":
            self.stats.tuned += 1
        elif outcome == "cached":
            self.stats.tune_cached += 1
        elif error is not None:
            self.stats.tune_failures[what] = error

    def started(self, tuning: Awaitable[Any]) -> None:
        """A tuning run this scope must see finished when it ends."""
        self._tunings.append(tuning)

    async def _finish(self) -> None:
        """Wait for every job and tuning run the scope started; count their outcomes."""
        for prep in self._preps:
            if prep.future is not None:
                await prep.future
            self._count(prep)
        for tuning in self._tunings:
            try:
                await tuning
            except Exception:  # counted by the caller that awaited it; or logged
                pass

    def _count(self, prep: _Prep) -> None:
        outcome, stats = prep.outcome, self.stats
        if isinstance(outcome, KernelPrepared):
            if outcome.origin in CACHE_ORIGINS:
                stats.from_cache += 1
            else:
                stats.compiled += 1
            stats.stored += outcome.stored
        elif isinstance(outcome, BaseException):
            stats.failures.setdefault(prep.kernel_id, outcome)


def current_scope(part: WarmUp) -> Scope | None:
    """The innermost scope of the calling task's context open on ``part``'s client."""
    for scope in reversed(_SCOPES.get()):
        if scope._part is part and not scope._ended:
            return scope
    return None


def leave_scopes() -> None:
    """Leave every scope in the calling task's context (a tuner's own measuring task:
    its launches run, whatever scope started it)."""
    _SCOPES.set(())


def _reached(channel: Channel, fut: Any) -> None:
    """The command :meth:`WarmUp.reached` awaits: it collects what was dropped (the
    server's batch end) and resolves its future."""
    channel.settled(fut)
    channel.server.end_batch()
    if not fut.done():
        fut.set_result(None)


def _settle(channel: Channel, stream: StreamId, fut: Any) -> None:
    """The command :meth:`WarmUp.settle` awaits: the server's sync of every stream,
    watched without blocking; once done, the server's batch end releases what the
    device passed, and ``fut`` resolves (with None, whatever the sync's outcome: an
    error of the device is the next awaited command's)."""
    server = channel.server

    def done(completion: Any = None) -> None:
        if completion is not None:
            try:
                completion.result()  # gives its events back
            except Exception:  # the device's error: the next awaited command's
                pass
        channel.settled(fut)
        server.end_batch()
        if not fut.done():
            fut.set_result(None)

    try:
        completion = server.sync(stream)
    except Exception:  # a closing server, say: nothing to wait for
        done()
        return
    channel.watcher.watch(completion, done)


def _clear_ended_frames(exc: BaseException) -> None:
    """Clear the locals of the frames an absorbed :class:`LaunchDropped` (or each one of
    a group) passed through, which have ended: the handler's buffers are dropped now,
    not when the error is freed after the scope (``frame.clear()`` leaves the frames
    still running, the block's own)."""
    for error in exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,):
        if isinstance(error, BaseExceptionGroup):
            _clear_ended_frames(error)
        else:
            traceback.clear_frames(error.__traceback__)
    traceback.clear_frames(exc.__traceback__)


def _dropped(kernel: Kernel) -> LaunchDropped:
    return LaunchDropped(
        f"kernel {kernel.id!r} was compiled and dropped by a warm-up scope "
        "(client.warm_up()): it did not run, so this buffer holds no result of it. A read "
        "of it inside the scope ends a warm-up pass (the scope absorbs this error)"
    )


def _only_dropped(exc: BaseException) -> bool:
    """True when ``exc`` is a LaunchDropped, or a group made only of them."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(LaunchDropped)
        return rest is None
    return isinstance(exc, LaunchDropped)


def _warm_up_error(failures: dict[str, BaseException]) -> WarmUpError:
    lines = "; ".join(f"{kid!r}: {type(e).__name__}: {e}" for kid, e in failures.items())
    error = WarmUpError(
        f"{len(failures)} kernel(s) failed in the warm-up scope: {lines}. Nothing was held "
        "on any stream; fix the kernel (or pass raise_on_failure=False to only record "
        "failures in the scope's stats)",
        failures,
    )
    error.__cause__ = next(iter(failures.values()))
    return error
