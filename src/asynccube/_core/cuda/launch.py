"""Kernels on the CUDA server: compiling and loading them (``prepare``, in a worker
thread), checking a launch against the kernel and the device once per signature, and
launching with arguments packed by :mod:`.abi`.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Container
from typing import Any, Final

from ..errors import InvalidArgument
from ..server.launch_limits import LaunchLimits, block_problem, grid_problem
from ..server.preparation import KernelPrepared
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import CudaSource, Kernel
from ..values.stream_id import StreamId
from ..values.types import ExecutionMode
from .abi import ArgPack
from .cubin import kernel_param_sizes
from .driver import check, cu, error_from
from .native.hotpath import hot
from .state import LoadedKernel
from .timing import ProfileOps
from .tma import encode_tensor_map

__all__ = ["WARM_KERNEL", "LaunchOps"]

WARM_KERNEL: Final = Kernel(
    "asynccube_warm_up",
    cuda=CudaSource('extern "C" __global__ void asynccube_warm_up() {}', "asynccube_warm_up"),
)
"""Compiled and loaded when a server opens, to load NVRTC and the module loader."""


class LaunchOps(ProfileOps):
    """Kernel loading, checking and launching."""

    # -- execution ------------------------------------------------------------------

    @property
    def loaded_kernels(self) -> Container[str]:
        """The ids of the kernels loaded so far (``prepare`` has nothing to do for a
        launch of one with a static count; the client then skips calling it)."""
        return self._kernels.keys()

    def prepare(
        self, kernel: Kernel, count: CubeCount | None = None, stream: StreamId | None = None
    ) -> Callable[[], None] | None:
        """Blocking work to run in a worker thread before ``execute`` (None: nothing to
        do): compiling and loading a kernel not seen yet, and, given a dynamic ``count``
        and its ``stream``, waiting for the count to be read back. Never raises: errors
        surface from the job or from ``execute``."""
        if kernel.id in self._kernels and (count is None or count.binding is None):
            return None  # the usual case: loaded, static count
        jobs: list[Callable[[], object]] = []
        if kernel.cuda is not None and kernel.id not in self._kernels:
            jobs.append(lambda: self._load_counted(kernel))
            self._loads[0] += 1  # until the job ran (an export must not wait on it)
        if count is not None and count.binding is not None and stream is not None:
            try:
                jobs.append(self._prefetch_count(count, stream))
            except Exception:  # execute reads it (and raises) itself
                pass
        if not jobs:
            return None

        def run() -> None:
            for job in jobs:
                job()

        return run

    def _prefetch_count(self, count: CubeCount, stream: StreamId) -> Callable[[], None]:
        binding = count.binding
        assert binding is not None
        if binding.size < 12:
            raise InvalidArgument("dynamic CubeCount too small")
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, (binding,))
        buf = self._pinned.take(12)
        d = cu()
        check(d.cuMemcpyDtoHAsync(buf.ptr, ptr, 12, resolved.stream), "cuMemcpyDtoHAsync")
        event = self._events.record(resolved.stream)

        def wait() -> None:
            self._ctx.make_current()
            check(cu().cuEventSynchronize(event), "cuEventSynchronize(dynamic count)")
            self._counts[id(count)] = struct.unpack("<3I", ctypes.string_at(buf.ptr, 12))
            buf.release()
            self._events.give(event)

        return wait

    def _load_counted(self, kernel: Kernel) -> None:
        """:meth:`_load` in the job thread, counted in ``_loads`` until it ends."""
        try:
            self._load(kernel)
        finally:
            with self._loads_lock:
                self._loads[1] += 1

    def warm_up_launch(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> Callable[[], KernelPrepared] | None:
        """A launch a warm-up scope drops (``client.warm_up()``; see
        :mod:`..server.preparation`): the kernel must have a CUDA part (else
        KernelNotSupported, at once); the job compiles it (NVRTC, through the cubin
        caches) and loads its module, in a worker thread, then checks the launch's
        signature (and, CHECKED, its grid) as a first launch does, so that the first real
        launch of the same shape takes the one-call route (``cuda/fast.py``) and checks
        nothing; None when it is loaded already (checked now). Nothing is launched.
        Until the job ends, exports are refused as behind a first launch's load (loading
        a module synchronizes the device)."""
        kernel.cuda_part(self.device)
        pack = self._packer.get(bindings)[0]  # the actor's cache: not in the worker
        grid = (count.x, count.y, count.z) if count.binding is None else None
        checked = grid if mode is ExecutionMode.CHECKED else None
        loaded = self._kernels.get(kernel.id)
        if loaded is not None:
            self._check_warm(kernel, loaded, pack, checked)
            return None
        self._loads[0] += 1

        def job() -> KernelPrepared:
            try:
                trace: list[tuple[str, bool]] = []
                self._check_warm(kernel, self._load(kernel, trace), pack, checked)
                origin, stored = trace[0]
                return KernelPrepared(origin, stored)
            finally:
                with self._loads_lock:
                    self._loads[1] += 1

        return job

    def _check_warm(
        self,
        kernel: Kernel,
        loaded: LoadedKernel,
        pack: ArgPack,
        grid: tuple[int, int, int] | None,
    ) -> None:
        """A dropped launch's checks, as ``execute`` makes them once per signature and
        grid (they raise as that launch would)."""
        if pack not in loaded.checked:
            _check_signature(kernel, loaded, pack)
        if grid is not None and grid != loaded.grid_ok:
            self._check_launch(kernel, loaded, grid)

    def _load(self, kernel: Kernel, trace: list[tuple[str, bool]] | None = None) -> LoadedKernel:
        self._ctx.make_current()
        src = kernel.cuda_part(self.device)
        compiled, origin, stored = self._compiler.compile_traced(src, self._arch)
        if trace is not None:
            trace.append((origin, stored))
        d = cu()
        module = check(d.cuModuleLoadData(compiled.cubin), "cuModuleLoadData")
        function = check(d.cuModuleGetFunction(module, compiled.symbol.encode()))
        _finish_loading(function)
        if src.shared_mem_bytes > 48 * 1024:
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(d.cuFuncSetAttribute(function, attr, src.shared_mem_bytes), "cuFuncSetAttribute")
        loaded = LoadedKernel(
            function,
            module,
            src,
            compiled.symbol,
            _max_threads(function),
            _param_sizes(function, compiled.cubin, compiled.symbol),
        )
        self._kernels[kernel.id] = loaded
        return loaded

    def execute(
        self,
        kernel: Kernel,
        count: CubeCount,
        bindings: Bindings,
        mode: ExecutionMode,
        stream: StreamId,
    ) -> None:
        """Launch ``kernel`` over ``bindings`` on the stream's CUDA stream."""
        loaded = self._kernels.get(kernel.id)
        if loaded is None:
            if kernel.cuda is None:
                kernel.cuda_part(self.device)  # raises KernelNotSupported
            loaded = self._load(kernel)
        pointers = self._pointers(bindings.buffers)
        maps = [self._encode(t) for t in bindings.tensor_maps] if bindings.tensor_maps else ()
        pack, scalars = self._packer.get(bindings)
        if pack not in loaded.checked:
            _check_signature(kernel, loaded, pack)
        if count.binding is None:
            grid = (count.x, count.y, count.z)
            used = bindings.all_bindings() if maps else bindings.buffers
        else:
            grid = self._grid(count, stream)
            used = [*bindings.all_bindings(), count.binding]
        if mode is ExecutionMode.CHECKED and grid != loaded.grid_ok:
            self._check_launch(kernel, loaded, grid)
        resolved = self._streams.resolve(stream, used)
        gx, gy, gz = grid
        if not (gx and gy and gz):
            return
        meta = bindings.metadata.data
        bx, by, bz, smem = loaded.shape
        mark = self._mark(resolved.stream) if self.recorder.enabled else None
        err = self._launch(
            pack.state, loaded.function, gx, gy, gz, bx, by, bz, smem, resolved.stream,
            pointers, [s.data for s in scalars] if scalars else None,
            meta if meta.size else None, maps or None,
        )  # fmt: skip
        if err:
            raise error_from(err, f"cuLaunchKernel({kernel.id})")
        if mark is not None:
            self._timed_op(mark, resolved.stream, kernel.id, stream, "kernel", None)

    def _encode(self, tmap: Any) -> bytes:
        return encode_tensor_map(tmap.map, self._ptr(tmap.binding))

    def _grid(self, count: CubeCount, stream: StreamId) -> tuple[int, int, int]:
        """Read a dynamic count (blocks the actor until the stream reaches it)."""
        binding = count.binding
        assert binding is not None
        if binding.size < 12:
            raise InvalidArgument(
                f"a dynamic CubeCount needs 12 bytes (uint32 x, y, z); {binding!r} has "
                f"{binding.size}"
            )
        ready = self._counts.pop(id(count), None)
        if ready is not None:
            return ready
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, (binding,))
        buf = self._pinned.take(12)
        d = cu()
        check(d.cuMemcpyDtoHAsync(buf.ptr, ptr, 12, resolved.stream), "cuMemcpyDtoHAsync")
        check(d.cuStreamSynchronize(resolved.stream), "cuStreamSynchronize(dynamic count)")
        x, y, z = struct.unpack("<3I", ctypes.string_at(buf.ptr, 12))
        buf.release()
        return x, y, z

    def _check_launch(
        self, kernel: Kernel, loaded: LoadedKernel, grid: tuple[int, int, int]
    ) -> None:
        if loaded.problem is None:
            loaded.problem = self._static_problem(loaded)
        problem = loaded.problem or grid_problem(grid, self._max_grid)  # shared with host
        if problem:
            raise InvalidArgument(f"kernel {kernel.id!r} on {self.device}: {problem}")
        loaded.grid_ok = grid

    def _static_problem(self, loaded: LoadedKernel) -> str:
        """What is wrong with the kernel's block and shared memory on this device ("")."""
        extra = self._extra
        limit = min(extra["max_threads_per_block"], loaded.max_threads)
        smem = extra["max_shared_memory_per_block_optin"]
        limits = LaunchLimits(self._max_grid, tuple(extra["max_block_dim"]), limit, smem)
        return block_problem(loaded.source, limits)


def _finish_loading(function: Any) -> None:
    """Load ``function`` whole now, in the load's worker thread (``cuFuncLoad``, CUDA
    12.4+): under lazy loading (the driver's default since 12.2) the handle
    ``cuModuleGetFunction`` returns may be loaded only in part, and the driver then
    finishes the loading in the kernel's first ``cuLaunchKernel``, on the loop's thread:
    the first request after a warm-up would pay it. A driver without the call, or that
    refuses it, leaves the loading to that launch, as before."""
    load = getattr(cu(), "cuFuncLoad", None)
    if load is None:
        return
    try:
        load(function)
    except Exception:  # bindings newer than the driver: the symbol is missing there
        pass


def _max_threads(function: Any) -> int:
    d = cu()
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    return int(check(d.cuFuncGetAttribute(attr, function), "cuFuncGetAttribute"))


def _param_sizes(function: Any, cubin: bytes, symbol: str) -> tuple[int, ...] | None:
    """The byte size of each of the kernel's parameters (None: nothing can say).

    From ``cuFuncGetParamCount`` + ``cuFuncGetParamInfo`` where the driver has them, else
    from the cubin itself (:mod:`.cubin`): ``cuFuncGetParamInfo`` is never probed past
    the last parameter, a failing call that compute-sanitizer reports. Only when neither
    says is the driver probed as before."""
    answer = hot.param_sizes(function)
    if answer is not None:
        err, sizes = answer
        if err:
            raise error_from(err, "cuFuncGetParamCount/cuFuncGetParamInfo")
        return sizes
    sizes = kernel_param_sizes(cubin, symbol)
    if sizes is not None:
        return sizes
    get = getattr(cu(), "cuFuncGetParamInfo", None)
    if get is None:
        return None
    probed = []
    for index in range(1024):
        res = get(function, index)
        if res[0]:
            break
        probed.append(int(res[2]))
    return tuple(probed)


def _check_signature(kernel: Kernel, loaded: LoadedKernel, pack: ArgPack) -> None:
    sig = pack.signature
    want = tuple(sig.param_sizes())
    have = loaded.param_sizes
    if have is not None and have != want:
        raise InvalidArgument(
            f"kernel {kernel.id!r} ({loaded.symbol}) takes parameters of {list(have)} bytes, "
            f"but the bindings give {list(want)} ({sig}); see the kernel ABI: buffers, "
            "tensor maps, scalars by dtype, then one metadata struct"
        )
    loaded.checked.add(pack)
