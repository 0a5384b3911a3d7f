"""The awaitables a client returns (``read``, ``sync``, ``memory_usage``, ...).

A :class:`ClientFuture` is an :class:`asyncio.Future` that knows the stream and the
line that asked for it, so that nothing it carries is lost:

* dropped without being awaited (nor its exception asked, nor a callback added, as
  ``asyncio.gather``/``wait`` do), it warns, as an unawaited coroutine does:
  a :class:`RuntimeWarning` naming the call and where it was made;
* dropped with an error nobody retrieved, it gives the error back to its stream: the
  next awaited call there raises it, once (``close()`` raises it otherwise).

Under trio the same class is mixed into the trio adapter's future
(:func:`client_future_type`, used by :mod:`.trio_loop`). Each client future is made by
:func:`new_future`; the client's internal futures stay plain. Where the extensions are
built, ``new_future`` is the compiled one (``_native_future.c``: the same frames walked
through the C API, about 0.2 us less a future); ``python_new_future`` is its twin.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from ..extensions import compiled
from ..values.stream_id import StreamId

if TYPE_CHECKING:
    from .held import HeldErrors

__all__ = ["NATIVE_REASON", "ClientFuture", "WatchedFuture", "new_future", "python_new_future"]

T = TypeVar("T")
_getframe = sys._getframe
_future_await = asyncio.Future.__await__
_PACKAGE = "asynccube."


class WatchedFuture:
    """What every client future does when it is dropped (see above); mixed into an
    asyncio future class whose ``__slots__`` name ``_ac_from``, ``_ac_seen`` and
    ``_ac_stream``."""

    __slots__ = ()
    _ac_from: tuple[HeldErrors, str, str, int]
    """(errors store, call, file, line) of the call that made it."""
    _ac_seen: bool
    _ac_stream: StreamId
    """The stream its error goes back to (set when it fails)."""

    def __del__(self) -> None:
        fut: asyncio.Future[Any] = self  # type: ignore[assignment]
        seen = getattr(self, "_ac_seen", False)
        if seen and not fut._log_traceback:  # the common case: awaited, nothing left
            return
        try:
            origin = self._ac_from
        except AttributeError:  # not made by new_future: asyncio's own finalizer
            super().__del__()  # type: ignore[misc]
            return
        if not fut.done() or fut.cancelled():
            return
        if fut._log_traceback:  # an error nobody retrieved: back to its stream
            error = fut.exception()
            stream = getattr(self, "_ac_stream", None)
            if error is not None and stream is not None:
                origin[0].restore(stream, error)
        if not seen:
            _warn_unawaited(origin)

    def add_done_callback(self, fn: Callable[..., object], *, context: Any = None) -> None:
        """As :meth:`asyncio.Future.add_done_callback` (it counts as awaiting it)."""
        self._ac_seen = True  # type: ignore[misc]  # a slot of the concrete classes
        super().add_done_callback(fn, context=context)  # type: ignore[misc]

    # No Python ``result()`` here: an error raised from a Python frame of the future's
    # own would hold the future (``self``) in its traceback, and the future the error.

    def exception(self) -> BaseException | None:
        """As :meth:`asyncio.Future.exception`."""
        self._ac_seen = True  # type: ignore[misc]
        return super().exception()  # type: ignore[misc, no-any-return]


class ClientFuture(WatchedFuture, asyncio.Future[T]):
    """An awaitable of a client (asyncio): see the module docstring."""

    __slots__ = ("_ac_from", "_ac_seen", "_ac_stream")

    def __await__(self) -> Generator[Any, None, T]:
        self._ac_seen = True
        return _future_await(self)

    __iter__ = __await__


def new_future(
    cls: type[asyncio.Future[Any]], loop: asyncio.AbstractEventLoop, held: HeldErrors
) -> asyncio.Future[Any]:
    """A client future of class ``cls`` (:class:`ClientFuture`, or trio's) on ``loop``,
    remembering which call made it (the first frame outside asynccube, and the last
    inside). Whoever fails it sets the stream its error goes back to (``_ac_stream``)."""
    fut = cls(loop=loop)
    frame: Any = _getframe(1)
    call = "a call"
    ours = _OURS
    while frame is not None:
        code = frame.f_code
        mine = ours.get(code.co_filename)  # a str: its hash is cached (a code's is not)
        if mine is None:
            name = frame.f_globals.get("__name__", "")
            mine = ours[code.co_filename] = name.startswith(_PACKAGE)
        if not mine:
            break
        call = code.co_name
        frame = frame.f_back
    if frame is None:
        fut._ac_from = (held, call, "?", 0)  # type: ignore[attr-defined]
    else:
        fut._ac_from = (held, call, frame.f_code.co_filename, frame.f_lineno)  # type: ignore[attr-defined]
    return fut


_OURS: dict[str, bool] = {}
"""Source file -> whether it is asynccube's (a cache for ``new_future``'s walk)."""

python_new_future = new_future
"""The pure-Python twin of ``_native_future.new_future`` (the same frames, the same
origin), used where the compiled one is not (``ASYNCCUBE_NO_EXTENSIONS``)."""
_NATIVE, NATIVE_REASON = compiled("asynccube._core.channel._native_future")
"""The compiled ``new_future``'s module (None: the twin is used) and why."""
if _NATIVE is not None:  # about 0.2 us less a future (a read's, a sync's)
    new_future = _NATIVE.new_future


def _warn_unawaited(origin: tuple[Any, str, str, int]) -> None:
    _, call, filename, line = origin
    warnings.warn(
        f"the awaitable returned by client.{call}() at {filename}:{line} was never "
        "awaited; await it (a fire-and-forget call returns None)",
        RuntimeWarning,
        stacklevel=2,
    )
