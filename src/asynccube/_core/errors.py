"""Every exception asynccube raises, in one module.

The hierarchy mirrors cubecl-runtime's ``IoError`` and its kin: every error derives from
:class:`AsyncCubeError`, so ``except asynccube.AsyncCubeError`` catches all of them.
Each message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AsyncCubeError",
    "AutotuneCheckError",
    "AutotuneError",
    "BufferTooBig",
    "ClientClosedError",
    "ClientDeadError",
    "CollectiveError",
    "CompilationError",
    "ConfigError",
    "CudaDriverError",
    "DLPackError",
    "DeviceError",
    "ExclusiveAccessError",
    "ExclusiveCallError",
    "ExecutionError",
    "ForeignStreamError",
    "GraphCaptureError",
    "GraphUpdateError",
    "InvalidArgument",
    "InvalidHandle",
    "IoError",
    "KernelDefinitionError",
    "KernelNotSupported",
    "LaunchDropped",
    "LoopMismatchError",
    "MemoryInUse",
    "MemoryLayoutError",
    "OutOfMemory",
    "ProfileError",
    "ScalarTypeError",
    "TaintedBuffer",
    "Unknown",
    "UnsupportedBackend",
    "UnsupportedIoOperation",
    "UnsupportedStrides",
    "WarmUpError",
]


class AsyncCubeError(Exception):
    """Base class of every error raised by asynccube."""

    def __reduce__(self) -> str | tuple[object, ...]:
        # Errors whose __init__ takes other arguments than the message pickle those.
        init = self.__dict__.get("_init_args")
        if init is None:
            return super().__reduce__()
        return (type(self), init, self.__dict__)


class IoError(AsyncCubeError):
    """An error from ``create``/``read``/``write`` (cubecl's ``IoError``)."""


class BufferTooBig(IoError):
    """A buffer size is negative or larger than the server can allocate.

    Attributes:
        size: The size, in bytes, that was requested.
    """

    def __init__(self, size: int, detail: str = "") -> None:
        self._init_args = (size, detail)
        self.size = size
        msg = f"cannot allocate a buffer of {size} bytes"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class UnsupportedStrides(IoError):
    """The strides given to a copy are not supported by this operation on this server."""


class InvalidHandle(IoError):
    """A handle or binding does not belong to this client, was freed, or is out of range.
    One of another client given to ``execute``, ``write`` or ``client.tensor`` is refused
    at the call (nothing is queued)."""


class TaintedBuffer(IoError):
    """A read of a buffer whose last writer failed, or that a launch skipped because of
    such a failure would have written: the bytes there are not what any successful
    command wrote. The message names the failed command and its error (raised on its
    own stream), and the skipped kernels from it to the buffer, in order; the error is
    also of the failed command's error type when that is one of asynccube's (a
    ``TaintedExecutionError`` is an :class:`ExecutionError`). A later successful write
    to the buffer clears this."""


_CARRIED: dict[type[BaseException], type[TaintedBuffer]] = {}
"""Root error type -> the class a read of a buffer carrying its failure raises."""


def carried_error(root: type[BaseException], message: str) -> TaintedBuffer:
    """The error a read of a buffer carrying a failure raises (see the errors guide):
    a :class:`TaintedBuffer` that is also of the root error's type when that is one of
    asynccube's (``except ExecutionError`` catches a failure that propagated from a
    kernel that raised), and a plain :class:`TaintedBuffer` otherwise."""
    if not issubclass(root, AsyncCubeError) or issubclass(root, TaintedBuffer):
        return TaintedBuffer(message)
    cls = _CARRIED.get(root)
    if cls is None:
        cls = _CARRIED[root] = _carried_class(root)
    return cls(message)


def _carried_class(root: type[AsyncCubeError]) -> type[TaintedBuffer]:
    def init(self: TaintedBuffer, message: str) -> None:
        Exception.__init__(self, message)  # not the root's: it may take other arguments

    def reduce(self: TaintedBuffer) -> tuple[object, ...]:
        return (carried_error, (root, str(self)))

    doc = f"A read of a buffer carrying the failure of a {root.__name__}."
    namespace = {"__init__": init, "__reduce__": reduce, "__doc__": doc}
    try:
        cls = type(f"Tainted{root.__name__}", (TaintedBuffer, root), namespace)
    except TypeError:  # layouts that cannot be combined: the message names the root
        return TaintedBuffer
    cls.__module__ = "asynccube"
    return cls


class Unknown(IoError):
    """An unexpected error happened while executing work; the message carries the cause."""


class UnsupportedIoOperation(IoError):
    """The server does not support this I/O operation."""


class OutOfMemory(IoError):
    """The storage could not provide memory, even after a cleanup and one retry.

    Attributes:
        size: Bytes requested.
        reserved: Bytes the memory manager had reserved when the request failed.
    """

    def __init__(self, size: int, reserved: int, detail: str = "") -> None:
        self._init_args = (size, reserved, detail)
        self.size = size
        self.reserved = reserved
        msg = (
            f"out of memory allocating {size} bytes with {reserved} bytes reserved; "
            "free handles you no longer need or call memory_cleanup()"
        )
        super().__init__(f"{msg} ({detail})" if detail else msg)


class InvalidArgument(AsyncCubeError, ValueError):
    """An argument has the wrong type or value; the message names it and the fix."""


class MemoryLayoutError(InvalidArgument):
    """A memory pool layout breaks a rule (a size <= 0, a pool no request can reach, a
    cap below one page, ...); the message names the pool by its index and what to do.

    Attributes:
        pool: The index of the offending pool in the layout, or ``None`` when the layout
            as a whole is at fault.
    """

    def __init__(self, message: str, pool: int | None = None) -> None:
        self._init_args = (message, pool)
        self.pool = pool
        super().__init__(message if pool is None else f"pool {pool}: {message}")


class MemoryInUse(AsyncCubeError):
    """The memory layout cannot be replaced while buffers of the old one are alive.

    Attributes:
        live: How many buffers were still alive.
    """

    def __init__(self, live: int) -> None:
        self._init_args = (live,)
        self.live = live
        super().__init__(
            f"cannot replace the memory layout: {live} buffer(s) of the current layout "
            "are still alive; drop every handle, binding and tensor of this client "
            "(and await client.sync()) first, or open a new client with the new layout"
        )


class ScalarTypeError(InvalidArgument):
    """A scalar binding has a dtype that does not match or is not supported."""


class KernelDefinitionError(InvalidArgument):
    """A kernel written once (``elementwise``/``reduction``) cannot be made: its
    expression does not parse, names an unknown function or operator, or has no numpy
    type promotion for the dtypes bound at the call. The message names the part of the
    expression and the dtypes; raised at the definition or at the call, never as a
    compiler's error."""


class KernelNotSupported(AsyncCubeError):
    """A kernel has no part for the server it was sent to (e.g. no ``host`` function)."""


class CompilationError(AsyncCubeError):
    """A kernel failed to compile; ``log`` holds the compiler's log."""

    def __init__(self, message: str, log: str = "") -> None:
        self._init_args = (message, log)
        self.log = log
        super().__init__(f"{message}\n{log}" if log else message)


class DeviceError(AsyncCubeError):
    """The device reported an error (a driver error, or a sticky fault such as an
    illegal address). After a sticky fault the client is unhealthy: close it and open
    a new one."""


class ExecutionError(AsyncCubeError):
    """A kernel failed while it ran (fire-and-forget work); ``__cause__`` is the original
    exception. Raised at the next awaited call on the stream that ran the kernel. A host
    kernel that raises a ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``,
    ``GeneratorExit``) fails the same way: it is this error's ``__cause__``, never
    re-raised on the event loop, and the worker thread goes on."""


class GraphCaptureError(AsyncCubeError):
    """An operation cannot be recorded into a graph (a read, a sync, an allocation that
    needs a new page, a dynamic cube count...), or a capture was used from another task
    or after its client closed. The message names the operation; the capture has ended
    and nothing of it was kept."""


class GraphUpdateError(InvalidArgument):
    """A graph replay's update does not fit the captured launch (another signature, a
    buffer of a different size, an unknown launch index)."""


class CudaDriverError(DeviceError):
    """A CUDA driver API call returned an error.

    Attributes:
        code: The ``CUresult`` value, as an int.
        name: The driver's name for it (``cuGetErrorName``), e.g. ``CUDA_ERROR_ILLEGAL_ADDRESS``.
        text: The driver's description of it (``cuGetErrorString``).
        call: The driver function (or operation) that failed.
        sticky: True for errors that corrupt the context (illegal address, launch
            failure, ...): every later call fails too, so the client is unhealthy and
            must be closed; a new one can then be opened.
    """

    def __init__(self, code: int, name: str, text: str, call: str = "", sticky: bool = False):
        self.code = code
        self.name = name
        self.text = text
        self.call = call
        self.sticky = sticky
        where = f"{call} failed: " if call else ""
        tail = " (sticky: the CUDA context is unusable; close this client)" if sticky else ""
        super().__init__(f"{where}{name} ({code}): {text}{tail}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.code, self.name, self.text, self.call, self.sticky))


class ProfileError(AsyncCubeError):
    """A profile could not be completed (unknown or already-ended token, or failure)."""


class AutotuneError(AsyncCubeError):
    """Autotuning failed; the message names each tunable's failure."""


class AutotuneCheckError(AutotuneError):
    """Autotune checks (``TuneChecks(strict=True)``) found implementations whose outputs
    disagree with the reference.

    Attributes:
        report: The :class:`~asynccube.CheckReport` naming each disagreement.
    """

    def __init__(self, report: object) -> None:
        self._init_args = (report,)
        self.report = report
        super().__init__(str(report))


class LaunchDropped(AsyncCubeError):
    """A launch was compiled and dropped by a warm-up scope (``client.warm_up()``, the
    counterpart of cubecl-runtime's ``DryRun``): it never ran, so the buffers it would
    have written hold no result. A read of one raises this (as a
    :class:`TaintedBuffer`), inside the scope or after it, until a later write or a
    launch that runs writes the buffer again; a launch binding one outside a warm-up is
    skipped. A warm-up scope ends quietly when this leaves its block (a handler's read
    ended the pass)."""


class WarmUpError(AsyncCubeError):
    """Kernels failed to compile or load in a warm-up scope: raised when the scope ends
    (``client.warm_up(raise_on_failure=False)`` only records them). The message names
    each kernel and its error; ``failures`` maps each kernel id to its error (the first
    is also the ``__cause__``). Nothing is held on any stream: a later launch of such a
    kernel compiles it again, and fails at its own awaited call if it still fails.

    Attributes:
        failures: Kernel id -> the error its compile or load raised.
    """

    def __init__(self, message: str, failures: dict[str, BaseException] | None = None) -> None:
        self._init_args = (message, failures)
        self.failures: dict[str, BaseException] = dict(failures or {})
        super().__init__(message)


class ConfigError(AsyncCubeError):
    """A configuration key or value is invalid; the message names key, value and file."""


class ClientClosedError(AsyncCubeError):
    """The client was closed; open a new one with ``open_client()`` or ``connect()``."""


class ClientDeadError(AsyncCubeError):
    """The client's actor task died; every pending and later call raises this.

    The cause is chained as ``__cause__``.
    """


class LoopMismatchError(AsyncCubeError, RuntimeError):
    """The client was called from a thread or event loop other than the one it runs on.

    Use ``asyncio.run_coroutine_threadsafe(coro, client.loop)`` to reach it from another
    thread.
    """


class UnsupportedBackend(AsyncCubeError, RuntimeError):
    """A client was opened outside a running event loop, or under an async library
    asynccube does not run on; the message says which one is needed."""


class DLPackError(AsyncCubeError, BufferError):
    """A DLPack exchange cannot be made: memory on another device, strides or a dtype
    that cannot be expressed, read-only memory, a busy buffer, or a stream or version
    the exchange does not support; the message says which, and what to do."""


class ForeignStreamError(InvalidArgument):
    """Another library's stream or event cannot be waited on (``client.wait``/``after``):
    an unsupported type, a stream or event of another device or context (every CUDA
    object on the host server), or a handle the driver rejects; the message names the
    object and what to pass instead. (A raw handle of a destroyed stream is a dangling
    pointer, which the driver cannot check: keep the object owning a stream alive.)"""


class ExclusiveAccessError(AsyncCubeError):
    """``client.exclusive()`` or ``client.exclusive_call()`` was misused: nested in the
    same task, or a command that would wait for itself (a command from the callable of
    ``exclusive_call``, or a command of another task held by the block and awaited from
    inside it). The message says which, and what to do; the client keeps serving (on a
    closed client both raise :class:`ClientClosedError`)."""


class ExclusiveCallError(AsyncCubeError):
    """The callable passed to ``client.exclusive_call()`` raised: the message carries
    its type and message, ``__cause__`` the original exception; the client keeps
    serving (cubecl's ``exclusive`` turns a task panic into a recoverable error)."""


class CollectiveError(AsyncCubeError):
    """A collective across clients (``all_reduce``, ``broadcast``, ``all_gather``,
    ``reduce_scatter``) failed after it was queued: a read or write of one of its
    buffers, the computation itself, or the NCCL library (the message names NCCL's error
    string); ``__cause__`` carries the original error. Each client's stream holds its own
    copy, so every client's next awaited call there sees it; every client keeps serving."""


def _report_as_public() -> None:
    """Name each public error by where users import it (``asynccube.X``), not this
    private module: tracebacks and reprs say ``asynccube.LoopMismatchError``, and pickle
    finds the class there. (CudaDriverError is not exported: it keeps its own module.)"""
    for name in __all__:
        if name != "CudaDriverError":
            globals()[name].__module__ = "asynccube"


_report_as_public()
