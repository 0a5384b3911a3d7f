"""NVRTC compilation of :class:`~asynccube._core.values.kernel.CudaSource` to a cubin.

Always a cubin for the device's exact architecture (``sm_90a`` on Hopper), never PTX:
PTX made by an NVRTC newer than the driver cannot be loaded by it, while a cubin can.

Results are cached in memory and on disk. The key is the sha256 of the source, entry,
options, architecture, NVRTC version and the ABI prelude; a disk entry is a small
header (magic, payload length, payload sha256, lowered entry name) followed by the
cubin, written atomically (temporary file + ``os.replace``). An entry that is missing,
truncated or corrupt is recompiled and rewritten, with a debug log line: never an error.
An unwritable cache directory only costs the disk cache.

Compilation blocks for tens to hundreds of milliseconds: call it off the event loop
(the CUDA server runs it in a worker thread). Everything here is thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..errors import CompilationError
from ..values.kernel import CudaSource
from .abi import PRELUDE
from .arch import arch_for

__all__ = [
    "CompiledKernel",
    "KernelCompiler",
    "arch_for",
    "compile_cubin",
    "default_cache_dir",
    "nvrtc_version",
]

log = logging.getLogger("asynccube.compilation")

_MAGIC: Final = b"ACCUBIN1"
_HEADER: Final = struct.Struct("<8sQ32sH")  # magic, payload size, payload sha256, name len
_KEY_VERSION: Final = b"asynccube-cubin-1"
_VIRTUAL_HEADER: Final = "asynccube.h"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/asynccube/kernels``, else ``~/.cache/asynccube/kernels``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "asynccube" / "kernels"


_nvrtc: Any = None


def _lib() -> Any:
    global _nvrtc
    if _nvrtc is None:
        try:
            from cuda.bindings import nvrtc
        except Exception as exc:
            raise CompilationError(f"NVRTC is not available: {exc}") from exc
        _nvrtc = nvrtc
    return _nvrtc


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)`` version."""
    try:
        err, major, minor = _lib().nvrtcVersion()
    except CompilationError:
        raise
    except Exception as exc:  # the library itself failed to load
        raise CompilationError(f"NVRTC could not be loaded: {exc}") from exc
    if err:
        raise CompilationError(f"nvrtcVersion failed: {err!r}")
    return int(major), int(minor)


@dataclass(frozen=True, slots=True)
class CompiledKernel:
    """A compiled kernel: the cubin and the symbol to look its entry up by."""

    cubin: bytes
    symbol: str
    arch: str
    key: str


@dataclass(slots=True)
class CompileStats:
    """Counters, for tests and logs."""

    compiles: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    disk_rejected: int = 0
    disk_write_errors: int = 0


@dataclass
class KernelCompiler:
    """Compiles CUDA sources with NVRTC behind a memory cache and a disk cache.

    Args:
        cache_dir: Directory of the disk cache (created on demand); ``None`` disables it.
        include_cuda_headers: Add the CUDA toolkit's include directory (when
            ``cuda.pathfinder`` finds one) so sources may include CUDA headers.
    """

    cache_dir: Path | None = field(default_factory=default_cache_dir)
    include_cuda_headers: bool = True
    stats: CompileStats = field(default_factory=CompileStats)
    _memory: dict[str, CompiledKernel] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)

    def compile(self, src: CudaSource, arch: str) -> CompiledKernel:
        """The cubin of ``src`` for ``arch`` (from a cache when possible)."""
        return self.compile_traced(src, arch)[0]

    def compile_traced(self, src: CudaSource, arch: str) -> tuple[CompiledKernel, str, bool]:
        """:meth:`compile`, saying where the cubin came from: ``"compiled"`` (NVRTC ran),
        ``"memory"`` or ``"disk"`` (a cache), and whether it was stored in the disk
        cache (for a warm-up scope's statistics)."""
        options = self._options(src, arch)
        key = cache_key(src, arch, options)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self.stats.memory_hits += 1
                return hit, "memory", False
        origin, stored = "disk", False
        out = self._from_disk(key, arch)
        if out is None:
            out = self._compile(src, arch, options, key)
            origin, stored = "compiled", self._to_disk(out)
        with self._lock:
            self._memory[key] = out
        return out, origin, stored

    def _options(self, src: CudaSource, arch: str) -> tuple[str, ...]:
        extra = [f"-arch={arch}"]
        include = _cuda_include_dir() if self.include_cuda_headers else None
        if include is not None:
            extra.append(f"-I{include}")
        return (*extra, *src.options)

    def _compile(
        self, src: CudaSource, arch: str, options: Sequence[str], key: str
    ) -> CompiledKernel:
        cubin, symbol = run_nvrtc(src, options)
        with self._lock:
            self.stats.compiles += 1
        log.debug("compiled %s for %s (%d bytes)", src.entry, arch, len(cubin))
        return CompiledKernel(cubin, symbol, arch, key)

    def _path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{key}.cubin"

    def _from_disk(self, key: str, arch: str) -> CompiledKernel | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        parsed = _parse_entry(raw)
        if parsed is None:
            with self._lock:
                self.stats.disk_rejected += 1
            log.debug("kernel cache entry %s is corrupt or truncated; recompiling", path)
            return None
        with self._lock:
            self.stats.disk_hits += 1
        return CompiledKernel(parsed[0], parsed[1], arch, key)

    def _to_disk(self, kernel: CompiledKernel) -> bool:
        """Write ``kernel`` to the disk cache; False where there is none or it failed."""
        path = self._path(kernel.key)
        if path is None:
            return False
        try:
            _atomic_write(path, _format_entry(kernel.cubin, kernel.symbol))
        except OSError as exc:
            with self._lock:
                self.stats.disk_write_errors += 1
            log.debug("could not write kernel cache entry %s: %s", path, exc)
            return False
        return True

    def clear_memory(self) -> None:
        """Forget the in-memory cache (the disk cache stays)."""
        with self._lock:
            self._memory.clear()


def cache_key(src: CudaSource, arch: str, options: Sequence[str]) -> str:
    """The sha256 naming a compilation of ``src`` for ``arch`` with ``options``."""
    h = hashlib.sha256(_KEY_VERSION)
    major, minor = nvrtc_version()
    for part in (src.source, src.entry, arch, f"{major}.{minor}", PRELUDE, *options):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _format_entry(cubin: bytes, symbol: str) -> bytes:
    name = symbol.encode()
    head = _HEADER.pack(_MAGIC, len(cubin), hashlib.sha256(cubin).digest(), len(name))
    return head + name + cubin


def _parse_entry(raw: bytes) -> tuple[bytes, str] | None:
    if len(raw) < _HEADER.size:
        return None
    magic, size, digest, name_len = _HEADER.unpack_from(raw)
    start = _HEADER.size + name_len
    cubin = raw[start:]
    if magic != _MAGIC or len(cubin) != size or hashlib.sha256(cubin).digest() != digest:
        return None
    try:
        return cubin, raw[_HEADER.size : start].decode()
    except UnicodeDecodeError:
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_include: list[str | None] = []


def _cuda_include_dir() -> str | None:
    if not _include:
        try:
            from cuda.pathfinder import find_nvidia_header_directory

            _include.append(find_nvidia_header_directory("cudart"))
        except Exception:
            _include.append(None)
    return _include[0]


def run_nvrtc(src: CudaSource, options: Sequence[str]) -> tuple[bytes, str]:
    """Compile ``src`` with NVRTC; return the cubin and the entry's lowered name."""
    nv = _lib()
    err, prog = nv.nvrtcCreateProgram(
        src.source.encode(),
        f"{src.entry}.cu".encode(),
        1,
        [PRELUDE.encode()],
        [_VIRTUAL_HEADER.encode()],
    )
    _nvrtc_check(err, "nvrtcCreateProgram", src)
    try:
        entry = src.entry.encode()
        _nvrtc_check(nv.nvrtcAddNameExpression(prog, entry)[0], "nvrtcAddNameExpression", src)
        (err,) = nv.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        if err:
            raise CompilationError(
                f"NVRTC could not compile kernel entry {src.entry!r} "
                f"({' '.join(options)}): {_error_string(err)}",
                _program_log(prog),
            )
        err, lowered = nv.nvrtcGetLoweredName(prog, entry)
        _nvrtc_check(err, "nvrtcGetLoweredName", src)
        return _cubin(prog, src), bytes(lowered).decode()
    finally:
        nv.nvrtcDestroyProgram(prog)


def _cubin(prog: Any, src: CudaSource) -> bytes:
    nv = _lib()
    err, size = nv.nvrtcGetCUBINSize(prog)
    _nvrtc_check(err, "nvrtcGetCUBINSize", src)
    buf = bytearray(size)
    _nvrtc_check(nv.nvrtcGetCUBIN(prog, buf)[0], "nvrtcGetCUBIN", src)
    if not size:
        raise CompilationError(
            f"NVRTC produced no cubin for {src.entry!r}: pass a real -arch=sm_XY, not compute_XY"
        )
    return bytes(buf)


def _program_log(prog: Any) -> str:
    nv = _lib()
    err, size = nv.nvrtcGetProgramLogSize(prog)
    if err or size <= 1:
        return ""
    buf = bytearray(size)
    nv.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace").strip()


def _error_string(err: Any) -> str:
    try:
        return bytes(_lib().nvrtcGetErrorString(err)[1]).decode()
    except Exception:
        return repr(err)


def _nvrtc_check(err: Any, call: str, src: CudaSource) -> None:
    if err:
        raise CompilationError(
            f"{call} failed for kernel entry {src.entry!r}: {_error_string(err)}"
        )


_compilers: dict[Path | None, KernelCompiler] = {}
_compilers_lock = threading.Lock()


def compiler_for(cache_dir: str | os.PathLike[str] | bool | None = True) -> KernelCompiler:
    """The shared compiler for ``cache_dir`` (``True``: the default directory;
    ``None``/``False``: no disk cache)."""
    path: Path | None
    if cache_dir is True:
        path = default_cache_dir()
    elif cache_dir is None or cache_dir is False:
        path = None
    else:
        path = Path(cache_dir)
    with _compilers_lock:
        comp = _compilers.get(path)
        if comp is None:
            comp = _compilers[path] = KernelCompiler(cache_dir=path)
        return comp


def compile_cubin(
    src: CudaSource, arch: str, cache_dir: str | os.PathLike[str] | bool | None = True
) -> bytes:
    """Compile ``src`` for ``arch`` (e.g. ``"sm_90a"``) to a cubin, through the caches.

    Blocking: run it in a worker thread, never on the event loop. Raises
    :class:`CompilationError` (with NVRTC's log) when the source does not compile.
    """
    return compiler_for(cache_dir).compile(src, arch).cubin
