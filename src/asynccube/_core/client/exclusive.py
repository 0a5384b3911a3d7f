"""Exclusive access, the client's half: ``async with client.exclusive():`` and
``await client.exclusive_call(fn, *args)`` (cubecl's ``ComputeClient::exclusive``).

Entering waits for this client's turn (one block at a time, first asked first served),
then for every command queued before it, on every stream, to complete on the device,
so that another library (NCCL, cuBLAS through torch, a profiler) can use the device
without this client's work interleaving. Inside, the commands of the block's scope (the
task that entered it, and the tasks it starts inside the block) run as usual; those of
every other task are held, in order, without blocking the loop (fire-and-forget calls
return at once, awaitables stay pending) and queued when the block ends, however it
ends (returned, raised, cancelled). The channel's half, and the deadlocks it turns into
errors, are in :mod:`..channel.exclusive`.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ..channel.exclusive import SCOPE, Block, Gate
from ..errors import ExclusiveCallError, InvalidArgument
from ..values.stream_id import StreamId

if TYPE_CHECKING:
    from .parts import ClientParts

__all__ = ["exclusive", "exclusive_call"]

T = TypeVar("T")


@asynccontextmanager
async def exclusive(client: ClientParts) -> AsyncIterator[None]:
    """See :meth:`ComputeClient.exclusive`."""
    block = await _enter(client)
    token = SCOPE.set(block)
    try:
        await _drained(client)
        yield
    finally:
        SCOPE.reset(token)
        block.gate.leave(block)


async def exclusive_call(client: ClientParts, fn: Callable[..., T], *args: Any) -> T:
    """See :meth:`ComputeClient.exclusive_call`."""
    if not callable(fn):
        raise InvalidArgument(
            f"exclusive_call needs a callable, got {type(fn).__name__}; pass the "
            "function and its arguments: client.exclusive_call(fn, *args)"
        )
    block = await _enter(client)
    token = SCOPE.set(block)
    try:
        await _drained(client)
    except BaseException:
        block.gate.leave(block)
        raise
    finally:
        SCOPE.reset(token)
    context = contextvars.copy_context()
    context.run(SCOPE.set, block.call_scope)
    done = client._channel.loop.create_future()
    _thread.start_new_thread(_work, (client._channel.loop, done, context, fn, args))
    # The block ends when the callable returns, even if the caller is cancelled first:
    # the device stays its own until then.
    done.add_done_callback(lambda _: block.gate.leave(block))
    result: T = await client._channel.backend.shield(done)
    return result


async def _enter(client: ClientParts) -> Block:
    channel = client._channel
    channel.check()
    gate = channel.exclusive_gate
    if gate is None:
        gate = channel.exclusive_gate = Gate(channel)
    return await gate.enter()


async def _drained(client: ClientParts) -> None:
    """Wait for every command queued before the block to complete, on every stream."""
    channel = client._channel
    await channel.request(channel.await_completion, StreamId.current(), client._server.sync)


def _work(
    loop: asyncio.AbstractEventLoop,
    done: asyncio.Future[Any],
    context: contextvars.Context,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """Run ``fn(*args)`` in ``context`` (a worker thread) and settle ``done`` with its
    result, or with an ExclusiveCallError carrying its error."""
    error: BaseException | None = None
    value: Any = None
    try:
        value = context.run(fn, *args)
    except BaseException as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        error = ExclusiveCallError(
            f"the callable passed to exclusive_call ({_name(fn)}) raised "
            f"{type(exc).__name__}: {first}; the client keeps serving"
        )
        error.__cause__ = exc
    del fn, args
    try:
        loop.call_soon_threadsafe(_settle, done, value, error)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _settle(done: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
