"""Which async library a client runs under, and the few things the core needs from it.

A client runs on asyncio (uvloop included: it is an asyncio loop) or on trio (directly
or through anyio). The running library is detected with sniffio (as anyio and httpcore
do) when a client opens, and one :class:`Backend` is chosen for it then, as httpcore
injects its network backend: the channel, the completion watcher and the job thread
drive a *loop* (``create_future``, ``call_soon``, ``call_soon_threadsafe``,
``call_later``, ``add_reader``, ``create_task``) and await a few helpers (a checkpoint,
waiting for a future, shielding one, a blocking job in a thread: under asyncio, on the
process's pool of :mod:`.blocking`).

* asyncio: the loop is the running asyncio loop itself, so the asyncio path is the code
  as it always was (nothing is wrapped, nothing added per command).
* trio: the loop is an adapter (:mod:`.trio_loop`, imported only under trio) whose
  futures are asyncio futures that trio tasks can await, and whose callbacks run in one
  trio system task.

Outside any event loop, or under another library (curio), :class:`UnsupportedBackend`
says what is needed, instead of a bare ``RuntimeError`` from deep inside.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, Protocol, TypeVar

from ..errors import UnsupportedBackend
from . import blocking

_sniffio: ModuleType | None
try:
    import sniffio as _sniffio
except ImportError:  # a declared dependency, but a bare environment (PYTHONPATH=src) may
    _sniffio = None  # lack it: detect asyncio and trio directly then

__all__ = [
    "SUPPORTED",
    "AsyncioBackend",
    "Backend",
    "backend_of",
    "current_backend",
    "current_library",
    "run_blocking",
    "run_blocking_owned",
    "running_loop",
    "shield",
    "to_thread",
    "wait_all",
]

T = TypeVar("T")

SUPPORTED = ("asyncio", "trio")
"""The async libraries a client runs on."""


class Backend(Protocol):
    """What the core needs from an async library, chosen once when a client opens."""

    name: str
    """``"asyncio"`` or ``"trio"``."""
    cancelled: tuple[type[BaseException], ...]
    """The exceptions that mean "this task was cancelled" (they must propagate)."""
    thread_hint: str
    """How to reach the client from another thread (for LoopMismatchError)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the channel drives: the asyncio loop, or trio's adapter."""
        ...

    def on_loop(self) -> bool:
        """True when called from a task of this loop (asked only when asyncio's running
        loop is not :attr:`loop`)."""
        ...

    def checkpoint(self) -> Awaitable[None]:
        """Yield to the loop once."""
        ...

    async def wait(self, fut: asyncio.Future[Any], within: float | None = None) -> None:
        """Wait until ``fut`` is done (or ``within`` seconds passed); never cancels it."""
        ...

    async def shield(self, fut: asyncio.Future[T]) -> T:
        """``fut``'s result; cancelling the caller does not cancel ``fut``."""
        ...

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` in a worker thread; a cancelled caller abandons it."""
        ...


class AsyncioBackend:
    """The native backend: the running asyncio loop, used as it is."""

    name = "asyncio"
    cancelled: tuple[type[BaseException], ...] = (asyncio.CancelledError,)
    thread_hint = "use asyncio.run_coroutine_threadsafe(coro, client.loop)"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def on_loop(self) -> bool:
        """True when ``loop`` is the running loop."""
        return asyncio._get_running_loop() is self.loop

    def checkpoint(self) -> Awaitable[None]:
        """``asyncio.sleep(0)``."""
        return asyncio.sleep(0)

    async def wait(self, fut: asyncio.Future[Any], within: float | None = None) -> None:
        """``asyncio.wait([fut], timeout=within)``."""
        await asyncio.wait([fut], timeout=within)

    async def shield(self, fut: asyncio.Future[T]) -> T:
        """``asyncio.shield(fut)``."""
        return await asyncio.shield(fut)

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a thread of the process's blocking pool (:mod:`.blocking`:
        ``run_in_executor``'s threads make the loop wait while each one starts)."""
        result: T = await blocking.pool.submit(self.loop, fn, *args)
        return result


def backend_of(loop: asyncio.AbstractEventLoop) -> Backend:
    """The backend driving ``loop`` (trio's adapter carries its own)."""
    own: Backend | None = getattr(loop, "backend", None)
    return own if own is not None else AsyncioBackend(loop)


def current_backend(what: str) -> Backend:
    """The backend of the running library for ``what`` (e.g. ``"open_client()"``), or
    :class:`UnsupportedBackend` naming the library found and what to do."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return AsyncioBackend(loop)
    library = current_library()
    if library == "trio":
        from .trio_backend import trio_backend

        return trio_backend()
    if library is None:
        raise UnsupportedBackend(
            f"{what} needs a running event loop (asyncio or trio) and none is running in "
            "this thread; call it from async code started by asyncio.run(main()), "
            "trio.run(main) or anyio.run(main)"
        )
    raise UnsupportedBackend(
        f"{what} was called under {library}, which asynccube does not run on; run it "
        "under asyncio (uvloop included) or trio, e.g. anyio.run(main, backend='trio')"
    )


def running_loop() -> asyncio.AbstractEventLoop:
    """The loop of the calling task: the running asyncio loop, or trio's adapter."""
    loop = asyncio._get_running_loop()
    return loop if loop is not None else current_backend("running_loop()").loop


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking ``fn(*args)`` in a worker thread: the process's blocking pool under
    asyncio (:mod:`.blocking`: its threads start without making the loop wait), trio's
    thread cache under trio."""
    loop = asyncio._get_running_loop()
    if loop is not None:  # the process's blocking pool (see .blocking)
        result: T = await blocking.pool.submit(loop, fn, *args)
        return result
    return await current_backend(getattr(fn, "__name__", "a blocking job")).run_sync(fn, *args)


async def run_blocking_owned(fn: Callable[..., T], dispose: Callable[[T], object], *args: Any) -> T:
    """:func:`run_blocking` for a job that makes something its caller must own (a CUDA
    server: a context, its pools, its threads). A caller cancelled while it waits
    abandons the thread (both libraries do), and the result would be lost with it
    still holding the device: here it goes to ``dispose`` instead, on the job's
    thread where the job ends after the cancel, at the cancel where the job had ended
    but its result had not reached the caller yet. Exactly once either way."""
    owned = _Owned(dispose)
    try:
        made: T = await run_blocking(owned.run, fn, *args)
    except BaseException:  # cancelled (or the job raised: then nothing was made)
        owned.abandon()
        raise
    owned.taken()
    return made


class _Owned:
    """What :func:`run_blocking_owned`'s job made, and whether its caller gave up."""

    __slots__ = ("_abandoned", "_dispose", "_lock", "_made")

    def __init__(self, dispose: Callable[[Any], object]) -> None:
        self._dispose = dispose
        self._lock = threading.Lock()
        self._abandoned = False
        self._made: list[Any] = []  # [result] between the job's end and the caller's

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The job (worker thread): ``fn(*args)``, handed to the caller, or disposed
        of here if the caller gave up meanwhile."""
        made = fn(*args)
        with self._lock:
            if not self._abandoned:
                self._made.append(made)
                return made
        self._disposed(made)
        return None

    def abandon(self) -> None:
        """The caller stopped waiting (loop thread): what the job made already is
        disposed of now; what it makes later, by the job."""
        with self._lock:
            self._abandoned = True
            made, self._made = self._made, []
        for each in made:
            self._disposed(each)

    def _disposed(self, made: Any) -> None:
        """``dispose(made)``; its failure reported (``sys.unraisablehook``), not raised:
        nobody waits for the job's result any more, and the caller's cancel goes on."""
        try:
            self._dispose(made)
        except Exception as exc:
            what = "disposing of what a cancelled job made"
            sys.unraisablehook(blocking.Unraisable(exc, what, self._dispose))

    def taken(self) -> None:
        """The caller has the result: nothing to dispose of, no reference kept."""
        self._made = []


async def to_thread(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread(fn, *args)`` (the caller's context variables carried over)
    on the process's blocking pool, or trio's ``to_thread.run_sync`` under trio."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        context = contextvars.copy_context()
        result: T = await blocking.pool.submit(loop, context.run, fn, *args)
        return result
    return await current_backend(getattr(fn, "__name__", "a blocking job")).run_sync(fn, *args)


async def shield(fut: asyncio.Future[T]) -> T:
    """``asyncio.shield(fut)`` on ``fut``'s own loop (asyncio's, or trio's adapter)."""
    return await backend_of(fut.get_loop()).shield(fut)


async def wait_all(futs: list[asyncio.Future[Any]]) -> None:
    """Wait until every future (of one loop) is done; never cancels them."""
    if futs:
        chosen = backend_of(futs[0].get_loop())
        if isinstance(chosen, AsyncioBackend):
            await asyncio.wait(futs)
            return
        for fut in futs:
            await chosen.wait(fut)


def current_library() -> str | None:
    """The async library running in this thread (sniffio's name), or None."""
    if _sniffio is not None:
        try:
            return str(_sniffio.current_async_library())
        except _sniffio.AsyncLibraryNotFoundError:
            return None
    if asyncio._get_running_loop() is not None:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return None
        return "trio"
    return None
