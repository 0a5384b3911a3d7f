"""Exclusive access: one block has the client's device to itself (cubecl's
``ComputeClient::exclusive``), the channel's half.

While a :class:`Block` is active, ``Channel.send`` asks it first (:meth:`Block.hold`,
one attribute test on the normal path): a command sent from the block's *scope* runs
as usual; any other command is held, in order, and queued when the block ends. The
scope is a context variable (:data:`SCOPE`) set by the task that entered the block, so
the tasks it starts inside the block (each copies its context) are in it too. The block
also adds a channel guard, so the servers' one-call routes (:mod:`.cuda.fast`,
:mod:`.cuda.fast_sync`, compiled and pure Python) decline while it is active and every
command takes the Python route through ``send``.

Turns (:class:`Gate`): one block at a time per channel; a block waits, without
blocking the loop, for the one before it to end, in the order they asked.

Deadlocks: an awaited command held by the block settles after the block ends; if the
block's scope waits for it (awaits it, or a task or a gather that awaits it), nothing
would ever end. While held awaitables exist, a timer walks who waits for each
(:func:`waited_from`: asyncio's done callbacks, trio's parked tasks) and fails the
ones the block's scope waits for with :class:`~.errors.ExclusiveAccessError`; each look
takes at most ``LOOK_S`` of the loop, a long list is looked at over several.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import AsyncCubeError, ExclusiveAccessError
from ..values.stream_id import StreamId
from .closing import State
from .closing import _close as close_op

if TYPE_CHECKING:
    from .settle import Op

__all__ = ["CHECK_S", "LOOK_S", "SCOPE", "Block", "CallScope", "Channel", "Gate", "waited_from"]

SCOPE: ContextVar[object | None] = ContextVar("asynccube_exclusive", default=None)
"""The exclusive scope of the calling context: a :class:`Block`, a :class:`CallScope`,
or None (a stale value, of a block that ended, counts as none)."""
CHECK_S = 0.005
"""Seconds between two looks for a held awaitable the block waits for."""
LOOK_S = 0.0005
"""The most seconds of the loop one look takes (many held awaitables take several)."""
_WALK_LIMIT = 10_000
"""The most futures one look visits from one held awaitable."""


class Channel(Protocol):
    """What a block and its gate see of the channel (it imports them: no circle)."""

    state: State
    loop: asyncio.AbstractEventLoop
    _exclusive: Block | None

    def add_guard(self, guard: Callable[[str], None]) -> None:
        """Call ``guard`` in ``check`` until removed."""
        ...

    def remove_guard(self, guard: Callable[[str], None]) -> None:
        """Stop calling ``guard``."""
        ...

    def queue_held(self, held: Iterable[tuple[Op, tuple[Any, ...]]]) -> None:
        """Queue held commands, in order, for the actor."""
        ...

    def unusable(self) -> AsyncCubeError:
        """The error a call on the closed or dead channel raises."""
        ...

    def _fail(
        self, fut: asyncio.Future[Any], exc: BaseException, stream: StreamId | None = None
    ) -> None: ...


class CallScope:
    """The scope of the callable that ``exclusive_call`` runs in a worker thread (its
    context, and the tasks it starts on the loop from there): no command may come from
    it, since the block waits for the callable."""

    __slots__ = ("block",)

    def __init__(self, block: Block) -> None:
        self.block = block


class Block:
    """One exclusive block of a channel, active from entry to release."""

    __slots__ = ("_cursor", "_timer", "active", "awaited", "call_scope", "channel", "gate", "held")

    def __init__(self, channel: Channel, gate: Gate) -> None:
        self.channel = channel
        self.gate = gate
        self.active = True
        self.held: deque[tuple[Op, tuple[Any, ...]]] = deque()
        """Commands of other scopes, in the order they were sent."""
        self.awaited: list[tuple[asyncio.Future[Any], tuple[Any, ...]]] = []
        """The held commands that settle a future (its args too: the stream)."""
        self.call_scope = CallScope(self)
        self._timer: asyncio.TimerHandle | None = None
        self._cursor = 0
        """Where the next look starts in ``awaited`` (a long list takes several)."""

    def hold(self, op: Op, args: tuple[Any, ...]) -> bool:
        """Hold ``op(*args)`` unless it comes from the block's scope (True: held). A
        close from the block's scope lets what is held run first, then closes."""
        if SCOPE.get() is self:
            if op is close_op and self.held:
                held, self.held = self.held, deque()
                self.channel.queue_held(held)
            return False
        self.held.append((op, args))
        if args and isinstance(args[-1], asyncio.Future):
            self.awaited.append((args[-1], args))
            self.watch()
        return True

    def guard(self, op: str) -> None:
        """The channel's check while the block is active (``op``: the client method):
        refuses a command from the callable of ``exclusive_call``."""
        if SCOPE.get() is self.call_scope:
            raise ExclusiveAccessError(
                f"{op}() was called from inside the callable passed to "
                "client.exclusive_call(): the client waits for that callable to return, "
                "so the command would wait for itself. Do the client's work before or "
                "after exclusive_call, or use `async with client.exclusive():` to mix "
                "the client's commands with other work"
            )

    def release(self) -> None:
        """End the block: queue what it held, in order (or fail it if the client
        cannot run it any more)."""
        if not self.active:
            return
        self.active = False
        channel = self.channel
        if channel._exclusive is self:
            channel._exclusive = None
        channel.remove_guard(self.guard)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self.held = self.held, deque()
        self.awaited.clear()
        if channel.state is State.OPEN or (
            channel.state is State.CLOSING and any(op is close_op for op, _ in held)
        ):
            channel.queue_held(held)
            return
        error = channel.unusable()
        for _, args in held:
            if args and isinstance(args[-1], asyncio.Future) and not args[-1].done():
                channel._fail(args[-1], error, _stream_of(args))

    # -- deadlocks ---------------------------------------------------------------------

    def watch(self) -> None:
        """Look for awaitables the block waits for in a moment (see the module)."""
        if self._timer is None and self.active:
            self._timer = self.channel.loop.call_later(CHECK_S, self._look)

    def _look(self) -> None:
        """Look at the held awaitables (and the tasks waiting for a turn) from where
        the last look stopped, for at most LOOK_S of the loop's time."""
        self._timer = None
        if not self.active:
            return
        if self._cursor == 0:  # a new round: drop what was settled meanwhile
            self.awaited = [(f, a) for f, a in self.awaited if not f.done()]
            self._look_at_waiters()
        end = time.perf_counter() + LOOK_S
        awaited, at = self.awaited, self._cursor
        while at < len(awaited) and time.perf_counter() < end:
            fut, args = awaited[at]
            at += 1
            how = None if fut.done() else waited_from(fut, self)
            if how is not None:
                error = _deadlock("a command of another task, held by the block", how)
                self.channel._fail(fut, error, _stream_of(args))
        self._cursor = 0 if at >= len(awaited) else at
        if awaited or self.gate.waiters:
            self.watch()

    def _look_at_waiters(self) -> None:
        for fut in [f for f in self.gate.waiters if not f.done()]:
            how = waited_from(fut, self)
            if how is not None:
                fut.set_exception(_deadlock("a task waiting to enter client.exclusive()", how))


class Gate:
    """A channel's turns of exclusive blocks, first asked first served."""

    __slots__ = ("active", "channel", "granted", "waiters")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.active: Block | None = None
        self.granted: asyncio.Future[None] | None = None
        """The waiter given the turn, until it enters (nobody may pass it)."""
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def enter(self) -> Block:
        """Wait for the turn (see above), then make a new block active."""
        check_not_nested(self.channel)
        if self.active is not None or self.granted is not None or self.waiters:
            await self._turn()
        channel = self.channel
        if channel.state is not State.OPEN:
            self._next()
            raise channel.unusable()
        block = self.active = Block(channel, self)
        channel._exclusive = block
        channel.add_guard(block.guard)
        return block

    def leave(self, block: Block) -> None:
        """End ``block`` and give the turn to the next waiter."""
        block.release()
        if self.active is block:
            self.active = None
            self._next()

    async def _turn(self) -> None:
        fut: asyncio.Future[None] = self.channel.loop.create_future()
        self.waiters.append(fut)
        if self.active is not None:
            self.active.watch()
        try:
            await fut
        except BaseException:
            if self.granted is fut:  # given the turn, then cancelled: pass it on
                self.granted = None
                self._next()
            elif fut in self.waiters:
                self.waiters.remove(fut)
            raise
        self.granted = None

    def _next(self) -> None:
        if self.active is not None or self.granted is not None:
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                self.granted = fut
                fut.set_result(None)
                return


def check_not_nested(channel: Channel) -> None:
    """Raise ExclusiveAccessError when the calling context is already in an active
    exclusive block of ``channel`` (or in the callable of its ``exclusive_call``)."""
    scope = SCOPE.get()
    block = scope.block if isinstance(scope, CallScope) else scope
    if not isinstance(block, Block) or not block.active or block.channel is not channel:
        return
    if scope is block:
        raise ExclusiveAccessError(
            "client.exclusive() or exclusive_call() was called inside an exclusive "
            "block of the same client (by the task that entered it, or a task it "
            "started there): the block already has the device to itself, and a nested "
            "one would wait for it to end. Do the work directly in the block"
        )
    raise ExclusiveAccessError(
        "client.exclusive() or exclusive_call() was called from inside the callable "
        "passed to client.exclusive_call(): it would wait for that callable to return"
    )


def waited_from(fut: asyncio.Future[Any], block: Block) -> str | None:
    """How the scope of ``block`` (or of its ``exclusive_call`` callable) waits for
    ``fut`` ("by task X through ..."), or None when it does not (as far as done
    callbacks and parked trio tasks tell)."""
    scopes = (block, block.call_scope)  # the callable waits for what it started too
    seen: set[int] = set()
    stack: list[tuple[asyncio.Future[Any], str]] = [(fut, "")]
    while stack and len(seen) < _WALK_LIMIT:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for task in getattr(node, "_parked", None) or ():  # trio tasks awaiting it
            if task.context.get(SCOPE) in scopes:
                return f"by trio task {task.name!r}{path}"
        for callback, context in list(getattr(node, "_callbacks", None) or ()):
            target = getattr(callback, "__self__", None)
            if isinstance(target, asyncio.Task):  # the task awaits node
                if context.get(SCOPE) in scopes:
                    return f"by task {target.get_name()!r}{path}"
                stack.append((target, f" through task {target.get_name()!r}{path}"))
                continue
            for nxt in _futures_in(callback):
                stack.append((nxt, f" through {type(nxt).__name__}{path}"))
    return None


def _futures_in(callback: Callable[..., Any]) -> Iterator[asyncio.Future[Any]]:
    """The futures a done callback settles or wakes: its bound future, the futures
    bound in its closure (gather's, wait's, shield's) or its partial's arguments."""
    target = getattr(callback, "__self__", None)
    if isinstance(target, asyncio.Future):
        yield target
    if isinstance(callback, functools.partial):
        yield from (a for a in callback.args if isinstance(a, asyncio.Future))
        callback = callback.func
    for cell in getattr(callback, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, asyncio.Future):
            yield value


def _deadlock(what: str, how: str) -> ExclusiveAccessError:
    return ExclusiveAccessError(
        f"client.exclusive() would deadlock: {what} is awaited from inside the block "
        f"({how}); it waits for the block to end, and the block waits for it. Commands "
        "of other tasks are held until the block ends: await them after the block, or "
        "issue them from the block's own task (or a task started inside the block)"
    )


def _stream_of(args: tuple[Any, ...]) -> StreamId | None:
    return args[0] if args and isinstance(args[0], StreamId) else None
