"""Turning server completions into resolved asyncio futures without blocking the loop.

Two paths, picked per completion:

* A completion that can notify (``add_done_callback``) is resolved from its callback:
  directly when it calls back on the loop's thread (``calls_back_on_loop``, as CUDA
  completions do), else through ``loop.call_soon_threadsafe`` (host workers). A CUDA
  completion watched for a caller about to await it (``spin=True``: the channel runs
  the command inline) is first polled for up to 30 µs without yielding, so short work
  resolves before its caller suspends. Nothing else spins: not the actor, whose caller
  has suspended already and whose queue holds other commands (a service under load lost
  a tenth of its loop to such spins), nor host completions (spinning would hold the GIL
  their worker threads need). A spin that runs out skips the next ``SPIN_BACKOFF``
  spins: work that outlasted one spin likely outlasts the next.
* Any other completion (a CUDA event) is polled with ``done()`` from one poller task,
  yielding to the loop between rounds (the backend's checkpoint: ``asyncio.sleep(0)``),
  for a short spin
  budget; a completion still pending after that is handed to a waiter thread, which
  blocks in ``wait()`` (never on the loop) and then resolves it through
  ``call_soon_threadsafe``. Short waits are fast; long waits cost no CPU.

No Python ever runs inside a driver callback thread.

A sync found done at the call must still suspend its awaiter once (so that tasks
cancelled before it have unwound: ``ComputeClient.sync``). :func:`one_step_later` and
:func:`settle_soon` give such a future. Under asyncio (uvloop included) it is a
:class:`LaterFuture`: settled as soon as a callback is attached to it, which is what
the awaiting task does as it suspends, so the task's wake-up is queued then, behind
the wake-ups already queued (those of the tasks cancelled before it), and runs in the
next loop iteration; a backstop settles one that nobody awaits in that iteration (a
``call_soon``, or the channel's end of its inline batch: ``settle_soon``). Settled
from a ``call_soon`` instead, the task would be woken only in the iteration after that
one: two loop iterations (two selector polls) where one keeps the promise. Under trio
the futures are trio's, settled from a ``call_soon`` (trio may run a batch's tasks in
reverse order: the caller must not run in the batch where the cancelled tasks unwind).
A loop callback that finds such a sync done after its caller suspended (the CUDA
server's poll in the next iteration) settles it with :func:`settle_now`, which runs the
callbacks at once instead of queuing them for one more iteration.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Protocol, TypeVar

from ..server.protocol import Completion
from .awaitable import ClientFuture, new_future

__all__ = ["CompletionWatcher", "LaterFuture", "later_futures", "one_step_later", "settle_now",
           "settle_soon", "to_loop"]  # fmt: skip

T = TypeVar("T")
Sink = Callable[[Completion[Any]], None]
SPIN_BACKOFF = 8
"""Spins skipped after one that ran out (see above)."""


class _Notifying(Protocol):
    def add_done_callback(self, fn: Callable[[], object]) -> None: ...


def _sleep0() -> Awaitable[None]:
    return asyncio.sleep(0)


class LaterFuture(ClientFuture[T]):
    """A client future (asyncio, uvloop) holding its outcome back until a callback is
    attached to it (the awaiting task's wake-up, as it suspends: see above) or its
    backstop runs (:func:`settle_later`), whichever comes first. Its source
    (``_ac_source``) is a settled future to copy, or :data:`NONE` for ``None``; it is
    let go of once settled."""

    __slots__ = ("_ac_source",)
    _ac_source: asyncio.Future[Any] | object | None

    def add_done_callback(self, fn: Callable[..., object], *, context: Any = None) -> None:
        """As :meth:`asyncio.Future.add_done_callback`; then settles the future (so the
        callback, queued by that, runs in the next loop iteration)."""
        self._ac_seen = True  # awaited, or handed to gather/wait: as WatchedFuture's
        _add_done_callback(self, fn, context=context)
        if self._ac_source is not None:
            settle_later(self)


_add_done_callback = asyncio.Future.add_done_callback
NONE: Final = object()
"""A :class:`LaterFuture`'s source meaning "settle with ``None``" (a sync)."""


def settle_later(later: LaterFuture[Any]) -> None:
    """Settle ``later`` from its source, once (its caller may have cancelled it)."""
    source = later._ac_source
    if source is None:
        return
    later._ac_source = None
    if later.done():
        return
    if source is NONE:
        later.set_result(None)
    else:
        _copy(source, later)  # type: ignore[arg-type]


class _Channel(Protocol):
    """What :func:`later_futures` asks of a channel (``channel.Channel``)."""

    backend: Any
    loop: asyncio.AbstractEventLoop
    _held: Any

    def future_factory(self) -> Callable[[], asyncio.Future[Any]]: ...


def later_futures(channel: _Channel) -> Callable[[], asyncio.Future[Any]]:
    """The maker of :func:`one_step_later`'s and :func:`settle_soon`'s futures for
    ``channel``'s client: :class:`LaterFuture` under asyncio, the channel's own class
    (trio's) elsewhere (see above)."""
    if channel.backend.name != "asyncio":
        return channel.future_factory()
    return functools.partial(new_future, LaterFuture, channel.loop, channel._held)


def settle_soon(
    later: asyncio.Future[None], batch: list[LaterFuture[Any]] | None = None
) -> asyncio.Future[None]:
    """``later`` (new, from :func:`later_futures`' maker), set to resolve with ``None``
    so that awaiting it suspends exactly once (see above); returned. ``batch``: the
    channel's list of such futures settled when its inline batch ends (the caller
    makes sure that end is scheduled: ``ran_inline``), a backstop without a loop
    callback of its own; else one is queued."""
    if type(later) is not LaterFuture:
        later.get_loop().call_soon(_settle_none, later)
    elif batch is not None:
        later._ac_source = NONE
        batch.append(later)
    else:
        later._ac_source = NONE
        later.get_loop().call_soon(settle_later, later)
    return later


def settle_now(fut: asyncio.Future[None]) -> None:
    """Settle ``fut`` with ``None`` and run its callbacks now, from the loop callback
    calling this (the awaiting task's wake-up among them: it resumes in this iteration),
    where ``set_result`` would queue them for the next one; a callback that raises is
    reported as the loop reports one. For a future whose awaiting task suspended in an
    earlier iteration (``cuda/fast_sync.py``'s poll), so that it still suspended once."""
    callbacks = fut._callbacks  # [(fn, context)], or None
    if callbacks:
        for fn, _ in callbacks:
            fut.remove_done_callback(fn)
    fut.set_result(None)
    for fn, context in callbacks or ():
        try:
            context.run(fn, fut)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # as asyncio's Handle._run reports it
            fut.get_loop().call_exception_handler(
                {"message": f"Exception in callback {fn!r}", "exception": exc, "future": fut}
            )


def _settle_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():  # unless its caller cancelled it
        fut.set_result(None)


def one_step_later(
    make: Callable[[], asyncio.Future[T]], fut: asyncio.Future[T]
) -> asyncio.Future[T]:
    """A future from ``make`` (:func:`later_futures`' maker) settled like the settled
    ``fut`` so that awaiting it suspends exactly once (see above): callbacks queued
    before it (the wake-ups of tasks cancelled before a sync, whose frames then unwind
    and drop their handles) run first."""
    later: asyncio.Future[T] = make()
    if type(later) is LaterFuture:
        later._ac_source = fut
        later.get_loop().call_soon(settle_later, later)  # the backstop
    else:
        later.get_loop().call_soon(_Relay(fut, later))
    return later


def _copy(fut: asyncio.Future[Any], later: asyncio.Future[Any]) -> None:
    """Settle ``later`` (not done) like ``fut`` (done)."""
    if fut.cancelled():
        later.cancel()
        return
    error = fut.exception()  # handed on: ``later`` gives it back if never retrieved
    if error is None:
        later.set_result(fut.result())
        return
    stream = getattr(fut, "_ac_stream", None)
    if stream is not None:
        later._ac_stream = stream  # type: ignore[attr-defined]
    later.set_exception(error)


class _Relay:
    """Settles ``later`` like ``fut`` once, then keeps neither (a loop may keep the last
    callback it ran, and an error's traceback holds the frames, so the buffers, of the
    task that raised it)."""

    __slots__ = ("fut", "later")

    def __init__(self, fut: asyncio.Future[Any], later: asyncio.Future[Any]) -> None:
        self.fut: asyncio.Future[Any] | None = fut
        self.later: asyncio.Future[Any] | None = later

    def __call__(self) -> None:
        fut, later = self.fut, self.later
        self.fut = self.later = None
        if fut is None or later is None or later.done():
            return
        _copy(fut, later)


class CompletionWatcher:
    """Resolves completions on one event loop.

    Args:
        loop: The loop that owns the futures (asyncio's, or the trio adapter).
        checkpoint: Yields to that loop once (the backend's; None: ``asyncio.sleep(0)``).
        spin_seconds: How long a completion is polled before a waiter thread takes it.
        sync_spin_seconds: How long a loop-thread completion is polled without yielding.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        checkpoint: Callable[[], Awaitable[None]] | None = None,
        spin_seconds: float = 200e-6,
        sync_spin_seconds: float = 30e-6,
    ) -> None:
        self._loop = loop
        self._checkpoint = _sleep0 if checkpoint is None else checkpoint
        self._spin = spin_seconds
        self._sync_spin = sync_spin_seconds
        self._polling: list[tuple[Completion[Any], Sink, float]] = []
        self._poller: asyncio.Task[None] | None = None
        self._waiters: ThreadPoolExecutor | None = None
        self._skip_spins = 0
        self.handed_to_threads = 0
        self.spins = 0
        """Spins that ran (for tests and benchmarks), whether they succeeded or not."""

    def watch(self, completion: Completion[Any], sink: Sink, spin: bool = False) -> None:
        """Call ``sink(completion)`` on the loop once ``completion`` is done. ``spin``:
        a caller is about to await it (poll a loop-thread completion briefly first)."""
        if completion.done():
            sink(completion)
        elif getattr(completion, "calls_back_on_loop", False):
            if spin and self._spin_now(completion):
                sink(completion)
                return
            notify: _Notifying = completion  # type: ignore[assignment]
            notify.add_done_callback(functools.partial(sink, completion))
        elif hasattr(completion, "add_done_callback"):
            notify = completion  # type: ignore[assignment]
            call = to_loop(self._loop)
            notify.add_done_callback(functools.partial(call, sink, completion))
        else:
            self._polling.append((completion, sink, time.perf_counter() + self._spin))
            if self._poller is None:
                self._poller = self._loop.create_task(self._poll(), name="asynccube-poller")

    def ran_out(self) -> None:
        """A one-call route's spin (``FastSync``'s, as long as ``sync_spin_seconds``)
        ran out: its command goes to the route, which then does not spin again, nor do
        the next spins (as after a spin of the watcher's own: ``SPIN_BACKOFF``)."""
        self._skip_spins = SPIN_BACKOFF

    def _spin_now(self, completion: Completion[Any]) -> bool:
        """Poll ``done()`` without yielding for up to ``sync_spin_seconds`` (tens of µs):
        a short copy or kernel then resolves before its caller even suspends. Skipped
        ``SPIN_BACKOFF`` times after a spin that ran out."""
        if self._skip_spins:
            self._skip_spins -= 1
            return False
        self.spins += 1
        deadline = time.perf_counter() + self._sync_spin
        while time.perf_counter() < deadline:
            if completion.done():
                return True
        self._skip_spins = SPIN_BACKOFF
        return False

    async def _poll(self) -> None:
        try:
            checkpoint = self._checkpoint
            while self._polling:
                self._round()
                await checkpoint()
        finally:
            self._poller = None

    def _round(self) -> None:
        now = time.perf_counter()
        still = []
        for item in self._polling:
            completion, sink, deadline = item
            if completion.done():
                sink(completion)
            elif now >= deadline:
                self._hand_over(completion, sink)
            else:
                still.append(item)
        self._polling = still

    def _hand_over(self, completion: Completion[Any], sink: Sink) -> None:
        if self._waiters is None:
            self._waiters = ThreadPoolExecutor(4, thread_name_prefix="asynccube-waiter")
        self.handed_to_threads += 1
        call = to_loop(self._loop)

        def block() -> None:
            completion.wait(None)
            call(sink, completion)

        self._waiters.submit(block)

    def shutdown(self) -> None:
        """Stop the waiter threads once they have finished (does not block)."""
        if self._waiters is not None:
            self._waiters.shutdown(wait=False)
            self._waiters = None


def to_loop(loop: asyncio.AbstractEventLoop) -> Callable[..., None]:
    """``loop.call_soon_threadsafe`` for a completion's thread, which may finish after
    the loop has ended (a client left to close when its loop closed): then nobody is
    left to resolve, and the call is dropped instead of raising in that thread."""
    call = loop.call_soon_threadsafe

    def threadsafe(fn: Callable[..., object], *args: Any) -> None:
        try:
            call(fn, *args)
        except RuntimeError as exc:  # asyncio: "Event loop is closed"; trio: RunFinishedError
            if not (loop.is_closed() or type(exc).__name__ == "RunFinishedError"):
                raise

    return threadsafe
