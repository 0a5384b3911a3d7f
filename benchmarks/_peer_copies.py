"""bench_peer's peers of ``to_client``: torch ``.to``, the raw driver copy (the floor) on
CUDA, and ``np.copyto`` on the host.

Each peer holds one source buffer of the size measured (:meth:`load`), times a batch of
copies to the destination ending in a synchronize (:meth:`batch`, seconds), checks one
copy's bytes (:meth:`check`) and frees its memory (:meth:`drop`). bench_peer calls the
CUDA peers in one worker thread of their own: torch and ``cuCtxSetCurrent`` change the
calling thread's current device, and the loop's thread stays asynccube's.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

_ALREADY_ENABLED = 704  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


class Peer(Protocol):
    """What bench_peer asks of a peer."""

    name: str

    def load(self, data: np.ndarray) -> None: ...
    def batch(self, reps: int) -> float: ...
    def check(self, data: np.ndarray) -> bool: ...
    def drop(self) -> None: ...
    def close(self) -> None: ...


def ordinal(device: str) -> int:
    """``"cuda:1"`` -> 1 (``"cuda"`` -> 0)."""
    return int(device.partition(":")[2] or 0)


class TorchCopy:
    """``x.to(dst, non_blocking=True, copy=True)`` (``copy=True``: a copy even when both
    are the same device), then ``torch.cuda.synchronize`` on both devices."""

    name = "torch"

    def __init__(self, src: str, dst: str) -> None:
        import torch  # ImportError: the caller reports torch as missing

        count = torch.cuda.device_count()
        if max(ordinal(src), ordinal(dst)) >= count:
            raise RuntimeError(f"torch sees {count} GPU(s), the benchmark needs {src} and {dst}")
        self.torch = torch
        self.src, self.dst = torch.device(ordinal_name(src)), torch.device(ordinal_name(dst))
        self.version = str(torch.__version__)
        self.x: Any = None

    def _sync(self) -> None:
        self.torch.cuda.synchronize(self.dst)
        self.torch.cuda.synchronize(self.src)

    def load(self, data: np.ndarray) -> None:
        self.x = self.torch.from_numpy(data).to(self.src)
        self._sync()

    def batch(self, reps: int) -> float:
        x, dst = self.x, self.dst
        self._sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            y = x.to(dst, non_blocking=True, copy=True)
        self._sync()
        elapsed = time.perf_counter() - t0
        del y
        return elapsed

    def check(self, data: np.ndarray) -> bool:
        y = self.x.to(self.dst, copy=True)
        return bool(np.array_equal(y.cpu().numpy(), data))

    def drop(self) -> None:
        self.x = None
        self.torch.cuda.empty_cache()

    def close(self) -> None:
        self.drop()


def ordinal_name(device: str) -> str:
    """``"cuda"`` -> ``"cuda:0"``."""
    return f"cuda:{ordinal(device)}"


class RawCopy:
    """``cuMemcpyPeerAsync`` between two devices (``cuMemcpyDtoDAsync`` on one) through
    cuda.bindings, between two buffers allocated up front, on a stream of the
    destination's primary context, then ``cuStreamSynchronize``: the floor."""

    def __init__(self, src: str, dst: str) -> None:
        from asynccube._core.cuda.driver import check, cu

        self.d, self.check_ = cu(), check
        d = self.d
        check(d.cuInit(0))
        self.ords = (ordinal(src), ordinal(dst))
        self.same = self.ords[0] == self.ords[1]
        self.name = "cuMemcpyDtoDAsync" if self.same else "cuMemcpyPeerAsync"
        self.devs = [check(d.cuDeviceGet(i)) for i in self.ords]
        self.ctxs = [check(d.cuDevicePrimaryCtxRetain(dev)) for dev in self.devs]
        if not self.same:  # peer access both ways, as torch and asynccube enable it
            for me, other in ((0, 1), (1, 0)):
                if not check(d.cuDeviceCanAccessPeer(self.devs[me], self.devs[other])):
                    continue  # no peer access: the driver stages the copy itself
                check(d.cuCtxSetCurrent(self.ctxs[me]))
                (err,) = d.cuCtxEnablePeerAccess(self.ctxs[other], 0)
                if err and int(err) != _ALREADY_ENABLED:
                    check((err,))
        check(d.cuCtxSetCurrent(self.ctxs[1]))
        self.stream = check(d.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING
        self.bufs: list[Any] = []
        self.size = 0

    def load(self, data: np.ndarray) -> None:
        self.drop()
        d, check = self.d, self.check_
        self.size = data.nbytes
        for ctx in self.ctxs:
            check(d.cuCtxSetCurrent(ctx))
            self.bufs.append(check(d.cuMemAlloc(self.size)))
        check(d.cuCtxSetCurrent(self.ctxs[0]))
        check(d.cuMemcpyHtoD(self.bufs[0], data.ctypes.data, self.size))

    def _copy(self) -> None:
        d, (src, dst), size = self.d, self.bufs, self.size
        if self.same:
            self.check_(d.cuMemcpyDtoDAsync(dst, src, size, self.stream))
        else:
            ctx_s, ctx_d = self.ctxs
            self.check_(d.cuMemcpyPeerAsync(dst, ctx_d, src, ctx_s, size, self.stream))

    def batch(self, reps: int) -> float:
        d, check = self.d, self.check_
        check(d.cuCtxSetCurrent(self.ctxs[1]))
        t0 = time.perf_counter()
        for _ in range(reps):
            self._copy()
        check(d.cuStreamSynchronize(self.stream))
        return time.perf_counter() - t0

    def check(self, data: np.ndarray) -> bool:
        out = np.empty_like(data)
        self.check_(self.d.cuCtxSetCurrent(self.ctxs[1]))
        self.check_(self.d.cuMemcpyDtoH(out.ctypes.data, self.bufs[1], self.size))
        return bool(np.array_equal(out, data))

    def drop(self) -> None:
        bufs, self.bufs = self.bufs, []
        for ctx, buf in zip(self.ctxs, bufs, strict=False):  # a failed load may hold one
            self.check_(self.d.cuCtxSetCurrent(ctx))
            self.check_(self.d.cuMemFree(buf))

    def close(self) -> None:
        self.drop()
        self.check_(self.d.cuCtxSetCurrent(self.ctxs[1]))
        self.check_(self.d.cuStreamDestroy(self.stream))
        for dev in self.devs:
            self.check_(self.d.cuDevicePrimaryCtxRelease(dev))


class NumpyCopy:
    """``np.copyto`` into an array allocated up front: the host's floor."""

    name = "np.copyto"

    def __init__(self) -> None:
        self.src: np.ndarray | None = None
        self.dst: np.ndarray | None = None

    def load(self, data: np.ndarray) -> None:
        self.src, self.dst = data.copy(), np.empty_like(data)

    def batch(self, reps: int) -> float:
        src, dst = self.src, self.dst
        assert src is not None
        assert dst is not None
        t0 = time.perf_counter()
        for _ in range(reps):
            np.copyto(dst, src)
        return time.perf_counter() - t0

    def check(self, data: np.ndarray) -> bool:
        assert self.dst is not None
        return bool(np.array_equal(self.dst, data))

    def drop(self) -> None:
        self.src = self.dst = None

    def close(self) -> None:
        self.drop()


def make_peers(src: str, dst: str) -> tuple[dict[str, Peer], dict[str, str]]:
    """The peers that can run (by role: ``"torch"``, ``"raw"``) and why the others
    cannot."""
    if not (src.startswith("cuda") and dst.startswith("cuda")):
        if src.startswith("cuda") or dst.startswith("cuda"):
            why = "the peers copy between two GPUs (or two host buffers) only"
            return {}, {"torch": why, "raw": why}
        return {"raw": NumpyCopy()}, {"torch": "torch compares GPU copies only"}
    peers: dict[str, Peer] = {}
    skipped: dict[str, str] = {}
    for role, kind in (("torch", TorchCopy), ("raw", RawCopy)):
        try:
            peers[role] = kind(src, dst)
        except Exception as exc:  # a missing package or GPU: reported in the table
            skipped[role] = f"{type(exc).__name__}: {exc}"
    return peers, skipped
