"""The execution part of a client: the actor's half of ``execute``. A launch the hot
path declined is offered to it once more on the actor; a kernel not yet loaded is
prepared (compiled, loaded) in a worker thread first; then the server fires it, and a
failure is held for the stream with the launch's buffers tainted. A launch binding a
buffer that carries a failure is skipped, its buffers carrying it too (on a server whose
failures are known at the call: the host server's workers do the same as they run)."""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from ..channel.channel import Channel
from ..server.protocol import ComputeServer
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import Binding, ExecutionMode
from .dispatch import Dispatch, Job

__all__ = ["Launcher", "written_by"]


class Launcher:
    """Runs one client's launches on its actor (see above)."""

    __slots__ = ("_channel", "_dispatch", "_fast", "_loaded", "_prepare", "_server")

    def __init__(
        self, server: ComputeServer, channel: Channel, dispatch: Dispatch, fast: Any
    ) -> None:
        self._server = server
        self._channel = channel
        self._dispatch = dispatch
        self._fast = fast  # the client's FastLaunch, or None
        # Optional server hook: compiling, loading a kernel, run in a worker thread.
        self._prepare: Callable[..., Job | None] | None = getattr(server, "prepare", None)
        # Optional: the ids of kernels the server has loaded (a launch of one with a static
        # count has nothing to prepare: the call to ``prepare`` is skipped).
        self._loaded: Container[str] = getattr(server, "loaded_kernels", ())

    def launch(
        self,
        stream: StreamId,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
    ) -> Any:
        """The actor's half of ``ComputeClient.execute``."""
        fast = self._fast  # run by the actor (a caller running it inline was declined)
        in_actor = fast is not None and self._channel.in_actor()
        if in_actor and fast.queued(kernel, count, bindings, mode, stream):
            return None
        channel = self._channel
        if (
            channel._held._tainted
            and channel._clears_at_call
            and _skipped(channel, kernel, count, bindings)
        ):
            return None
        prepare = self._prepare
        if prepare is None or (count.binding is None and kernel.id in self._loaded):
            job = None
        else:
            job = prepare(kernel, count, stream)
        if job is not None:
            fire, execute = self._channel.fire_writing, self._server.execute
            written = written_by(bindings)
            return self._dispatch.after(
                job, stream, fire, stream, written, execute, kernel, count, bindings, mode
            )
        try:  # Channel.fire_writing, inlined: one frame less per launch
            self._server.execute(kernel, count, bindings, mode, stream)
        except BaseException as exc:
            channel.hold(stream, exc)
            channel.taint(stream, written_by(bindings), exc)
            return None
        if channel._clears_at_call and channel._held._tainted:
            channel._held.clear(b.memory.id for b in written_by(bindings))
        return None


def _skipped(channel: Channel, kernel: Kernel, count: CubeCount, bindings: Bindings) -> bool:
    """Whether the launch is skipped: one of its buffers carries a failure (its written
    buffers carry it too then). For a server whose failures are known when a command is
    issued (CUDA); the host server's workers decide as the launch would run."""
    written = [b.memory.id for b in written_by(bindings)]
    bound = written if count.binding is None else [*written, count.binding.memory.id]
    return channel._held.skip(kernel.id, bound, written)


def written_by(bindings: Bindings) -> list[Binding]:
    """The bindings a launch may write: its buffers and its tensor maps' buffers."""
    if not bindings.tensor_maps:
        return list(bindings.buffers)
    return [*bindings.buffers, *(t.binding for t in bindings.tensor_maps)]
