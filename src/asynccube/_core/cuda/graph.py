"""CUDA graphs: stream capture of one task's stream, instantiated once, replayed with
``cuGraphLaunch``, launches updated with ``cuGraphExecKernelNodeSetParams``.

Opening a capture on stream S (the task's slot of the server's stream pool):

1. S is made to wait for every other stream (outside the capture), and MultiStream is
   told so, so the captured work never needs a cross-stream wait of its own;
2. a *shadow* stream waits for S's work so far: while S captures, anything that would
   record an event on S (another task's ``sync``, a cross-stream wait, the release of a
   slice last used on S) records it on the shadow stream instead, since none of the
   captured work runs before the graph is replayed. Waits S should make are deferred
   until the capture ends;
3. the server's ``execute``/``write`` are swapped for twins that note each launch's
   graph node (``cuStreamGetCaptureInfo``) and keep each copy's pinned source with the
   graph; the memory manager refuses new pages; timeline records pause;
4. ``cuStreamBeginCapture`` (relaxed mode, so other streams may compile and allocate).

A replay resolves the graph's bindings on the replaying task's stream (cross-stream
order, last-use stamps for memory reuse) and launches the graph there. A released
graph is destroyed once the device has passed its last replay.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CudaDriverError, GraphCaptureError, GraphUpdateError
from ..profiling.records import KernelRecorder
from ..server.capture import CapturedLaunch, NoNewPages, guarded_create, refuse_dynamic
from ..server.protocol import BytesLike
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import Kernel
from ..values.stream_id import StreamId
from ..values.types import Binding, CopyDescriptor, ExecutionMode
from .driver import check, cu

if TYPE_CHECKING:
    from .server import CudaServer

__all__ = ["CudaCapture", "CudaGraph"]


class CudaGraph:
    """An instantiated CUDA graph and everything it needs alive."""

    def __init__(
        self,
        server: CudaServer,
        handles: tuple[Any, Any],
        launches: list[CapturedLaunch],
        nodes: list[Any],
        keep: list[object],
    ) -> None:
        self._server = server
        self._graph, self._exec = handles
        self.launches = launches
        self._nodes = nodes
        self._params = [_node_params(n) for n in nodes]
        self._keep = keep
        self._bindings = self._collect()
        self._last: Any = None

    def _collect(self) -> list[Binding]:
        """Every binding of the graph, one per slice (a replay resolves each once)."""
        found = [b for launch in self.launches for b in launch.all_bindings()]
        found += [o for o in self._keep if isinstance(o, Binding)]
        return list({b.memory.id: b for b in found}.values())

    def replay(self, updates: Mapping[int, Bindings], stream: StreamId) -> None:
        """Apply ``updates`` (they stay in effect), then launch the graph on ``stream``."""
        if updates:
            for index, bindings in updates.items():
                self._update(index, bindings)
            self._bindings = self._collect()
        server = self._server
        resolved = server._streams.resolve(stream, self._bindings)
        check(cu().cuGraphLaunch(self._exec, resolved.stream), "cuGraphLaunch")
        self._last = resolved.stream

    def _update(self, index: int, bindings: Bindings) -> None:
        node, params = self._nodes[index], self._params[index]
        launch = self.launches[index]
        if node is None or params is None:
            raise GraphUpdateError(
                f"launch {index} ({launch.kernel.id!r}) has no kernel node to update "
                "(an empty grid, or a driver that did not report the node)"
            )
        server = self._server
        pointers = [server._ptr(b) for b in bindings.buffers]
        pack, scalars = server._packer.get(bindings)
        meta = bindings.metadata.data
        params.kernelParams = pack.pack(pointers, scalars, meta if meta.size else None, ())
        res = cu().cuGraphExecKernelNodeSetParams(self._exec, node, params)
        check(res, "cuGraphExecKernelNodeSetParams")
        launch.bindings = bindings

    def release(self) -> None:
        """Destroy the graph once the device has passed its last replay."""
        relics = _Relics(self._graph, self._exec, self._bindings, self._keep)
        self._graph = self._exec = None
        self._bindings, self._keep, self.launches = [], [], []
        if self._last is not None:
            self._server._retirer.hold(self._last, relics)
        else:
            relics.destroy()


class _Relics:
    """A released graph's handles and bindings; destroyed when the last reference goes
    (the retirer drops it once the device has passed the graph's last replay)."""

    def __init__(self, graph: Any, exec_: Any, bindings: list[Binding], keep: list[object]):
        self.handles = (graph, exec_)
        self.refs = (bindings, keep)

    def destroy(self) -> None:
        graph, exec_ = self.handles
        self.handles = (None, None)
        d = cu()
        if exec_ is not None:
            d.cuGraphExecDestroy(exec_)
        if graph is not None:
            d.cuGraphDestroy(graph)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing to free
            self.destroy()


def _node_params(node: Any) -> Any:
    if node is None:
        return None
    err, params = cu().cuGraphKernelNodeGetParams(node)
    return None if err else params


class CudaCapture:
    """Stream capture of one task's stream of a :class:`CudaServer` (module docstring)."""

    def __init__(self, server: CudaServer, stream: StreamId) -> None:
        d = cu()
        self._server = server
        streams = server._streams
        self._slot = streams.stream_index(stream)
        wrapper = streams.streams.get(stream)
        self.stream = wrapper.stream
        self._key = int(self.stream)
        server._retirer.seal()
        self._presync(wrapper)
        self.shadow = check(
            d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate"
        )
        server._backend.wait_event(self.shadow, server._events.record(self.stream))
        self.deferred: list[Any] = []
        self.keep: list[object] = []
        self.in_write = False
        self._launches: list[CapturedLaunch] = []
        self._nodes: list[Any] = []
        self._swap()
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        try:
            check(d.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        except BaseException:
            self._restore()
            raise

    def _presync(self, wrapper: Any) -> None:
        streams = self._server._streams
        backend = streams.backend
        for index, other in streams.streams.existing():
            if other is not wrapper:
                backend.wait_event(wrapper.stream, backend.flush(other.stream))
                wrapper.last_synced[index] = other.cursor

    def _swap(self) -> None:
        server: Any = self._server
        self._saved = (
            server._backend, server._retirer, server.recorder,
            server._streams.record_wait, server.memory.storage,
        )  # fmt: skip
        twin = _CaptureBackend(server._backend, self)
        server._backend = server._streams.backend = twin
        server._retirer = _CaptureRetirer(server._retirer, self)
        server.recorder = KernelRecorder()
        server._streams.record_wait = None
        pages = server.memory.storage = NoNewPages(server.memory.storage)
        server.create = guarded_create(server, pages, self._slot)
        server.execute = self._execute
        server.write = self._write
        server.close = self._close  # a client closing or dying mid-capture ends it first

    def _restore(self) -> None:
        server: Any = self._server
        backend, retirer, recorder, record_wait, storage = self._saved
        server._backend = server._streams.backend = backend
        server._retirer, server.recorder = retirer, recorder
        server._streams.record_wait = record_wait
        server.memory.storage = storage
        del server.execute, server.write, server.close, server.create
        wait = cu().cuStreamWaitEvent
        for event in self.deferred:  # waits S skipped while capturing, made now
            wait(self.stream, event, 0)
            server._events.give(event)
        self.deferred = []
        retirer.seal()  # events for what was held on the shadow stream, before it goes
        cu().cuStreamDestroy(self.shadow)

    def _close(self) -> Any:
        self.abort()
        return type(self._server).close(self._server)

    def mine(self, stream: Any) -> bool:
        """True for the captured CUDA stream."""
        return int(stream) == self._key

    def _execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        server = self._server
        if server._streams.stream_index(stream) != self._slot:
            type(server).execute(server, kernel, count, bindings, mode, stream)
            return
        refuse_dynamic(count)
        type(server).execute(server, kernel, count, bindings, mode, stream)
        launched = bool(count.x and count.y and count.z)
        self._nodes.append(self._last_node() if launched else None)
        self._launches.append(CapturedLaunch(kernel, count, bindings, mode))

    def _last_node(self) -> Any:
        res = cu().cuStreamGetCaptureInfo(self.stream)
        if res[0]:
            return None
        deps = next((r for r in res[1:] if isinstance(r, list | tuple)), None)
        return deps[0] if deps is not None and len(deps) == 1 else None

    def _write(self, items: Sequence[tuple[CopyDescriptor, BytesLike]], stream: StreamId) -> None:
        server = self._server
        if server._streams.stream_index(stream) != self._slot:
            type(server).write(server, items, stream)
            return
        self.in_write = True
        try:
            type(server).write(server, items, stream)
        finally:
            self.in_write = False
        self.keep.extend(desc.binding for desc, _ in items)

    def end(self) -> CudaGraph:
        """End the capture and instantiate the graph (GraphCaptureError if the driver
        invalidated the capture)."""
        d = cu()
        err, graph = d.cuStreamEndCapture(self.stream)
        self._restore()
        if err:
            if graph:
                d.cuGraphDestroy(graph)
            raise _invalidated(err)
        try:
            exec_ = check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BaseException:
            d.cuGraphDestroy(graph)
            raise
        check(d.cuGraphUpload(exec_, self.stream), "cuGraphUpload")
        return CudaGraph(self._server, (graph, exec_), self._launches, self._nodes, self.keep)

    def abort(self) -> None:
        """End the capture and drop the graph."""
        err, graph = cu().cuStreamEndCapture(self.stream)
        with contextlib.suppress(Exception):
            self._restore()
        if not err and graph:
            cu().cuGraphDestroy(graph)
        self._launches, self._nodes, self.keep = [], [], []


def _invalidated(err: Any) -> GraphCaptureError:
    from .driver import error_from

    cause: CudaDriverError = error_from(err, "cuStreamEndCapture")
    exc = GraphCaptureError(
        f"the driver invalidated the capture ({cause.name}): an operation in it could "
        "not be captured"
    )
    exc.__cause__ = cause
    return exc


class _CaptureBackend:
    """MultiStream's backend while S captures: events "on S" are recorded on the shadow
    stream, and waits of S are deferred (see the module docstring)."""

    def __init__(self, inner: Any, capture: CudaCapture) -> None:
        self._inner = inner
        self._capture = capture

    def flush(self, stream: Any) -> Any:
        capture = self._capture
        return self._inner.flush(capture.shadow if capture.mine(stream) else stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        if self._capture.mine(stream):
            self._capture.deferred.append(event)
        else:
            self._inner.wait_event(stream, event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _CaptureRetirer:
    """The server's retirer while S captures: a captured copy's pinned source stays with
    the graph; anything else held "on S" is held on the shadow stream."""

    def __init__(self, inner: Any, capture: CudaCapture) -> None:
        self._inner = inner
        self._capture = capture

    def hold(self, stream: Any, obj: object) -> None:
        capture = self._capture
        if not capture.mine(stream):
            self._inner.hold(stream, obj)
        elif capture.in_write:
            capture.keep.append(obj)
        else:
            self._inner.hold(capture.shadow, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
