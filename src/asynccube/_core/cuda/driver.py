"""The CUDA driver API, reached lazily through ``cuda.bindings.driver``.

This module is the one place where a ``CUresult`` becomes a library error:
:func:`check` turns every failure into :class:`~asynccube._core.errors.CudaDriverError`
carrying the driver's name and text for it, and marks the sticky ones (those after
which the context is unusable). Nothing is imported from ``cuda.bindings`` until a
function here is called, and :func:`driver_available` never raises.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import CudaDriverError, DeviceError
from ..server.protocol import DeviceProperties
from .arch import arch_for

__all__ = [
    "ALIGNMENT",
    "STICKY_ERRORS",
    "DeviceContext",
    "adopt_current",
    "check",
    "cu",
    "device_properties",
    "driver_available",
    "error_from",
    "forget_current",
    "list_devices",
    "set_current",
]

ALIGNMENT: Final = 512
"""Alignment of device storage handed out by asynccube (bytes)."""

STICKY_ERRORS: Final = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_NVLINK_UNCORRECTABLE",
        "CUDA_ERROR_CONTAINED",
        "CUDA_ERROR_EXTERNAL_DEVICE",
        "CUDA_ERROR_TENSOR_MEMORY_LEAK",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_DEINITIALIZED",
    }
)
"""Errors that leave the context unusable: every later call on it fails too."""

_module: Any = None
_init_lock = threading.Lock()
_tls = threading.local()
"""``context``: the context this module last made current on the thread."""
_available: tuple[bool, str] | None = None


def cu() -> Any:
    """The ``cuda.bindings.driver`` module (imported on first use)."""
    global _module
    if _module is None:
        from cuda.bindings import driver

        _module = driver
    return _module


def error_from(err: Any, call: str = "") -> CudaDriverError:
    """A :class:`CudaDriverError` for the ``CUresult`` ``err`` returned by ``call``."""
    code = int(err)
    try:  # the hot path returns plain ints
        err = cu().CUresult(code)
    except Exception:  # an unknown code, or no cuda.bindings: keep the int
        pass
    name = _error_name(err, code)
    text = _error_text(err, name)
    return CudaDriverError(code, name, text, call=call, sticky=name in STICKY_ERRORS)


def _error_name(err: Any, code: int) -> str:
    try:
        res, raw = cu().cuGetErrorName(err)
        if int(res) == 0 and raw:
            return bytes(raw).decode(errors="replace")
    except Exception:  # no driver library: fall back on the enum's own name
        pass
    try:
        return str(cu().CUresult(code).name)
    except Exception:
        return f"CUresult {code}"


def _error_text(err: Any, name: str) -> str:
    try:
        res, raw = cu().cuGetErrorString(err)
        if int(res) == 0 and raw:
            return bytes(raw).decode(errors="replace")
    except Exception:
        pass
    return name.removeprefix("CUDA_ERROR_").replace("_", " ").lower()


def check(result: tuple[Any, ...], call: str = "CUDA driver call") -> Any:
    """Raise if ``result[0]`` (a ``CUresult``) is an error; else return the values.

    ``cuda.bindings`` returns ``(err,)``, ``(err, value)`` or ``(err, v1, v2, ...)``;
    this returns ``None``, ``value`` or ``(v1, v2, ...)`` respectively.
    """
    err = result[0]
    if err:
        raise error_from(err, call)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def driver_available() -> tuple[bool, str]:
    """``(True, "")`` if the driver loads and sees a GPU, else ``(False, reason)``.

    Never raises; the answer is computed once per process.
    """
    global _available
    with _init_lock:
        if _available is None:
            _available = _probe()
        return _available


def _probe() -> tuple[bool, str]:
    try:
        d = cu()
    except Exception as exc:
        return False, f"cuda.bindings is not importable: {exc}"
    try:
        check(d.cuInit(0), "cuInit")
        count = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
    except Exception as exc:  # DynamicLibNotFoundError, CudaDriverError, ...
        return False, f"no usable CUDA driver: {type(exc).__name__}: {exc}"
    if count < 1:
        return False, "the CUDA driver sees no GPU"
    return True, ""


def set_current(context: Any) -> None:
    """Make ``context`` current on the calling thread, unless this module already did
    (a thread-local comparison: free when one device is used, one driver call when
    several clients on one loop take turns)."""
    if getattr(_tls, "context", None) is not context:
        check(cu().cuCtxSetCurrent(context), "cuCtxSetCurrent")
        _tls.context = context


def forget_current() -> None:
    """The calling thread's current context was changed behind this module's back (NCCL
    sets each device current in turn): the next :func:`set_current` makes the call."""
    _tls.context = None


def adopt_current(contexts: Iterable[Any]) -> None:
    """After a library that changes the current context itself (NCCL: each device in
    turn, then, in the versions read, the device current before its group again): ask
    the driver which context is current now (``cuCtxGetCurrent``: a lookup, no switch)
    and note it where it is one of ``contexts``, else forget it (as
    :func:`forget_current`): the next :func:`set_current` makes the call only where it
    must."""
    contexts = tuple(contexts)
    _tls.context = None  # unknown until the driver says
    if not contexts:
        return
    try:
        err, now = cu().cuCtxGetCurrent()
    except Exception:  # the answer is unknown: the next set_current makes the call
        return
    known = int(now or 0) if not int(err) else 0
    _tls.context = next((c for c in contexts if known and int(c) == known), None)


def list_devices() -> list[str]:
    """``"cuda:N  <name>"`` for each GPU the driver sees (raises if there is no driver)."""
    d = cu()
    check(d.cuInit(0), "cuInit")
    out = []
    for ordinal in range(int(check(d.cuDeviceGetCount(), "cuDeviceGetCount"))):
        dev = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        out.append(f"cuda:{ordinal}  {_device_name(dev)}")
    return out


def _device_name(dev: Any) -> str:
    raw = check(cu().cuDeviceGetName(256, dev), "cuDeviceGetName")
    return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")


def _attr(dev: Any, name: str, default: int = 0) -> int:
    d = cu()
    attr = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
    if attr is None:
        return default
    err, value = d.cuDeviceGetAttribute(attr, dev)
    return int(value) if not err else default


_INT_ATTRS: Final = {
    "sm_count": "MULTIPROCESSOR_COUNT",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "max_shared_memory_per_block": "MAX_SHARED_MEMORY_PER_BLOCK",
    "max_shared_memory_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "max_shared_memory_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "max_registers_per_block": "MAX_REGISTERS_PER_BLOCK",
    "warp_size": "WARP_SIZE",
    "l2_cache_size": "L2_CACHE_SIZE",
    "async_engine_count": "ASYNC_ENGINE_COUNT",
    "memory_pools_supported": "MEMORY_POOLS_SUPPORTED",
    "tensor_map_access_supported": "TENSOR_MAP_ACCESS_SUPPORTED",
    "stream_priorities_supported": "STREAM_PRIORITIES_SUPPORTED",
    "texture_pitch_alignment": "TEXTURE_PITCH_ALIGNMENT",
    "max_pitch": "MAX_PITCH",
    "pci_bus_id": "PCI_BUS_ID",
    "pci_device_id": "PCI_DEVICE_ID",
}


def device_handle(ordinal: int) -> Any:
    """The driver's handle of GPU ``ordinal``; an index the driver does not have raises
    DeviceError before any failing driver call (a sanitizer run shows only real errors)."""
    d = cu()
    count = int(check(d.cuDeviceGetCount(), "cuDeviceGetCount"))
    if not 0 <= ordinal < count:
        raise DeviceError(
            f"there is no GPU cuda:{ordinal}: the driver sees {count} "
            f"(cuda:0 to cuda:{count - 1}); `python -m asynccube info` lists them"
        )
    return check(d.cuDeviceGet(ordinal), "cuDeviceGet")


def device_properties(ordinal: int = 0) -> DeviceProperties:
    """Name, compute capability, SM count, memory and launch limits of GPU ``ordinal``.

    ``extra`` holds ``compute_capability`` (major, minor), ``arch`` (e.g. ``sm_90a``),
    ``total_memory``, ``max_block_dim``/``max_grid_dim`` (x, y, z), the entries of
    ``_INT_ATTRS`` and ``driver_version``.
    """
    d = cu()
    check(d.cuInit(0), "cuInit")
    dev = device_handle(ordinal)
    name = _device_name(dev)
    total = int(check(d.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
    cc = (_attr(dev, "COMPUTE_CAPABILITY_MAJOR"), _attr(dev, "COMPUTE_CAPABILITY_MINOR"))
    extra: dict[str, Any] = {key: _attr(dev, attr) for key, attr in _INT_ATTRS.items()}
    extra.update(
        ordinal=ordinal,
        compute_capability=cc,
        arch=arch_for(cc),
        total_memory=total,
        max_block_dim=tuple(_attr(dev, f"MAX_BLOCK_DIM_{a}") for a in "XYZ"),
        max_grid_dim=tuple(_attr(dev, f"MAX_GRID_DIM_{a}") for a in "XYZ"),
        driver_version=int(check(d.cuDriverGetVersion(), "cuDriverGetVersion")),
    )
    return DeviceProperties(name, "cuda", ALIGNMENT, total, extra)


_primary: dict[int, Any] = {}
"""The one wrapper object of each primary context (by its handle's value): each retain
returns a new one, and :func:`set_current` (and the one-call routes' check that their
context is current) compares objects, so two clients of one GPU taking turns on a loop
would make a ``cuCtxSetCurrent`` at each turn (and the routes decline) for a context that
is current already. A reset drops its entry (:func:`forget_primary`): the next client
gets a new object, so every thread makes it current again."""


def forget_primary(context: Any) -> None:
    """``context`` (a primary context) was reset: the next retain gets a new object."""
    try:
        key = int(context)
    except (TypeError, ValueError):
        return
    if _primary.get(key) is context:
        del _primary[key]


@dataclass(slots=True)
class DeviceContext:
    """GPU ``ordinal``'s primary context, retained for as long as this object is open.

    The primary context is the one the CUDA runtime, CuPy and PyTorch share, so
    pointers and streams interoperate with them. ``make_current`` must be called on
    every thread that issues driver calls (the actor's, a waiter thread).
    """

    ordinal: int
    device: Any
    context: Any
    closed: bool = False
    handle: int = field(init=False)
    """The context as an int (what ``cuStreamGetCtx`` gives back for its streams)."""

    def __post_init__(self) -> None:
        self.handle = int(self.context)

    @classmethod
    def open(cls, ordinal: int = 0) -> DeviceContext:
        """Initialize the driver, retain the primary context and make it current."""
        d = cu()
        check(d.cuInit(0), "cuInit")
        dev = device_handle(ordinal)
        ctx = check(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        ctx = _primary.setdefault(int(ctx), ctx)  # one object per context: see _primary
        out = cls(ordinal, dev, ctx)
        out.make_current()
        return out

    def make_current(self) -> None:
        """Bind the context to the calling thread."""
        check(cu().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        _tls.context = self.context

    def close(self) -> None:
        """Release the primary context (once); the driver frees it with its last user."""
        if not self.closed:
            self.closed = True
            check(cu().cuDevicePrimaryCtxRelease(self.device), "cuDevicePrimaryCtxRelease")
