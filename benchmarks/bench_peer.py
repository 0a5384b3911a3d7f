"""``to_client`` as a curve: 4 KiB to 1 GiB from one client to another, beside torch
``.to`` and the raw driver copy of the same bytes, in the same run (issue 32).

For each size (powers of 4), in ``--runs`` rounds, the three interleaved in each round
(their order alternated) and each the best of 3 batches:

* asynccube: a batch of ``copy = src.to_client(h, dst)`` then ``await dst.sync()``;
* torch: ``x.to(dst, non_blocking=True, copy=True)`` then ``torch.cuda.synchronize`` on
  both devices;
* raw: ``cuMemcpyPeerAsync`` (``cuMemcpyDtoDAsync`` on one device) through cuda.bindings
  into a buffer allocated up front, then ``cuStreamSynchronize``: the floor. Between host
  clients: ``np.copyto`` (torch is skipped).

A batch is ``--batch-mib`` of copies (at least 3, at most 1000). One copy of each is
checked byte for byte. Then the ordering check: a kernel writes the source right after a
slow one (``--spin-ms``), ``to_client`` and a kernel on the copy follow with no await in
between; the copy must hold what the kernel wrote, and both calls must return long before
the slow kernel ends (events, not a host wait).

    python benchmarks/bench_peer.py                          # cuda:0 -> cuda:1 (or cuda:0)
    python benchmarks/bench_peer.py --src cuda:0 --dst cuda:0 --runs 5
    python benchmarks/bench_peer.py --src host --dst host --max-mib 1 --runs 1 --json-only

Writes ``results/peer.json|md`` (``peer_host`` between host clients); ``--json-only``
writes nothing and prints the figures as JSON on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from _common import clock, environment, write  # noqa: E402
from _peer_copies import Peer, make_peers  # noqa: E402
from _peer_report import render, size_name  # noqa: E402

import asynccube as ac  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
BEST_OF = 3
Figures = dict[str, Any]

ORDER_SRC = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void axpb(float* x, float a, float b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = x[i] * a + b;
}
"""


def _spin_host(launch: ac.HostLaunch) -> None:
    import time

    time.sleep(int(launch.scalar(np.uint64)) / 1e9)


def _axpb_host(launch: ac.HostLaunch) -> None:
    (x,) = (buf.view(np.float32) for buf in launch.buffers)
    a, b = launch.scalars[np.dtype(np.float32)]
    n = int(launch.scalar(np.uint32))
    x[:n] = x[:n] * a + b


SPIN = ac.Kernel("bench_peer_spin", host=_spin_host,
                 cuda=ac.CudaSource(ORDER_SRC, "spin", (1, 1, 1)))  # fmt: skip
AXPB = ac.Kernel("bench_peer_axpb", host=_axpb_host, cuda=ac.CudaSource(ORDER_SRC, "axpb"))


def sizes(args: argparse.Namespace) -> list[int]:
    """The sizes measured: ``--sizes`` (KiB), else 4 KiB x 4^k up to ``--max-mib``."""
    if args.sizes:
        return [int(s) * KiB for s in args.sizes.split(",")]
    out, size = [], 4 * KiB
    while size <= args.max_mib * MiB:
        out.append(size)
        size *= 4
    return out


def copies(size: int, args: argparse.Namespace) -> int:
    """Copies per timed batch: ``--batch-mib`` of them, 3 to 1000."""
    return max(3, min(1000, int(args.batch_mib) * MiB // size))


def pattern(size: int) -> np.ndarray:
    """``size`` bytes that no shifted or partial copy reproduces."""
    return np.resize(np.arange(251, dtype=np.uint8), size)


async def ours_batch(
    src: ac.ComputeClient, dst: ac.ComputeClient, h: ac.Handle, reps: int
) -> float:
    """Seconds for ``reps`` ``to_client`` copies and the destination's sync."""
    await src.sync()
    await dst.sync()
    t0 = clock()
    for _ in range(reps):
        copy = src.to_client(h, dst)  # the last one dropped: its memory back in order
    await dst.sync()
    elapsed = clock() - t0
    del copy
    return elapsed


class Bench:
    """The two clients, the peers (in their own worker thread) and the figures."""

    def __init__(self, src: ac.ComputeClient, dst: ac.ComputeClient, args: argparse.Namespace):
        self.src, self.dst, self.args = src, dst, args
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bench-peer")
        self.peers: dict[str, Peer] = {}
        self.skipped: dict[str, str] = {}

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the peers' thread."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def start(self) -> None:
        self.peers, self.skipped = await self.call(make_peers, self.args.src, self.args.dst)

    async def close(self) -> None:
        for peer in self.peers.values():
            await self.call(peer.close)
        self.pool.shutdown()

    async def timed(self, who: str, h: ac.Handle, reps: int) -> float:
        """The best of :data:`BEST_OF` batches of ``who``, seconds."""
        best = []
        for _ in range(BEST_OF):
            if who == "asynccube":
                best.append(await ours_batch(self.src, self.dst, h, reps))
            else:
                best.append(await self.call(self.peers[who].batch, reps))
        return min(best)

    async def one_size(self, size: int) -> Figures:
        """GB/s of each, per run, for ``size`` bytes; every copy's bytes checked once."""
        src, dst, reps = self.src, self.dst, copies(size, self.args)
        data = pattern(size)
        h = src.create(data)
        await src.sync()
        for peer in self.peers.values():
            await self.call(peer.load, data)
        names = ["asynccube", *self.peers]
        for who in names:  # warm: peer access, the pools' first pages, torch's cache
            await self.timed(who, h, 1)
        runs = []
        for k in range(self.args.runs):
            order = names if k % 2 == 0 else names[::-1]
            times = {who: await self.timed(who, h, reps) for who in order}
            runs.append({who: size * reps / t / 1e9 for who, t in times.items()})
        got = await dst.read_array(src.to_client(h, dst), np.uint8)
        checked = {"asynccube": bool(np.array_equal(got, data))}
        for role, peer in self.peers.items():
            checked[role] = await self.call(peer.check, data)
            await self.call(peer.drop)
        del h, got
        src.memory_cleanup()
        dst.memory_cleanup()
        gbps = {who: statistics.median(r[who] for r in runs) for who in names}
        row = {"size": size, "copies": reps, "gbps": gbps, "runs": runs, "checked": checked}
        print(json.dumps(row), flush=True)
        return row


def _axpb(h: ac.Handle, a: float, b: float, n: int) -> ac.Bindings:
    bindings = ac.Bindings().with_buffer(h).with_scalar(np.float32, [a, b])
    return bindings.with_scalar(np.uint32, [n])


async def ordering(
    src: ac.ComputeClient, dst: ac.ComputeClient, size: int, spin_ms: float
) -> Figures:
    """The copy after the source's queued work and before the destination's later work,
    with no host wait: a slow kernel then a write on the source, ``to_client`` and a
    kernel on the copy, then a write on the source again; the copy must hold
    ``3 * 2 = 6``, and the calls must return long before the slow kernel ends."""
    n = size // 4
    count = ac.CubeCount(-(-n // 256))
    h = src.create(np.ones(n, np.float32))
    spin = ac.Bindings().with_scalar(np.uint64, [int(spin_ms * 1e6)])
    tries = []
    for attempt in range(3):  # the first warms the kernels and the pools' pages
        await src.sync()
        await dst.sync()
        src.execute(SPIN, ac.CubeCount(1), spin)
        src.execute(AXPB, count, _axpb(h, 0.0, 3.0, n))  # the source's queued work: 3
        t0 = clock()
        copy = src.to_client(h, dst)
        t1 = clock()
        dst.execute(AXPB, count, _axpb(copy, 2.0, 0.0, n))  # the destination's later work
        t2 = clock()
        src.execute(AXPB, count, _axpb(h, 0.0, -1.0, n))  # after the copy: not in it
        got = await dst.read_array(copy, np.float32)
        t3 = clock()
        after = await src.read_array(h, np.float32)
        ok = bool(np.all(got == 6.0)) and bool(np.all(after == -1.0))
        if attempt:
            tries.append({"to_client_us": (t1 - t0) * 1e6, "queued_ms": (t2 - t0) * 1e3,
                          "done_ms": (t3 - t0) * 1e3, "data_ok": ok})  # fmt: skip
    queued = max(t["queued_ms"] for t in tries)
    done = min(t["done_ms"] for t in tries)
    return {
        "size": size,
        "spin_ms": spin_ms,
        "tries": tries,
        "to_client_us": statistics.median(t["to_client_us"] for t in tries),
        "data_ok": all(t["data_ok"] for t in tries),
        "no_host_wait": queued < spin_ms / 2 and done >= 0.9 * spin_ms,
    }


def _path(src: ac.ComputeClient, dst: ac.ComputeClient) -> str:
    """How ``to_client`` copies between these two clients."""
    if src.properties.kind == dst.properties.kind == "cuda":
        from asynccube._core.cuda.peer import can_copy

        if can_copy(src.server, dst.server):
            return "peer (cuMemcpyPeerAsync on the destination's stream, after an event)"
    return "staged (a read into host memory, then a write)"


async def measure(args: argparse.Namespace) -> Figures:
    """The curve and the ordering check."""
    async with ac.open_client(args.src) as src, ac.open_client(args.dst) as dst:
        bench = Bench(src, dst, args)
        await bench.start()
        try:
            rows = [await bench.one_size(size) for size in sizes(args)]
        finally:
            await bench.close()
        order_size = min(256 * MiB, args.max_mib * MiB)
        order = await ordering(src, dst, order_size, args.spin_ms)
        return {
            "src": src.device,
            "dst": dst.device,
            "path": _path(src, dst),
            "raw": next((p.name for r, p in bench.peers.items() if r == "raw"), "-"),
            "torch": getattr(bench.peers.get("torch"), "version", None),
            "skipped": bench.skipped,
            "sizes": rows,
            "ordering": order,
        }


def _default_pair() -> tuple[str, str]:
    from asynccube._core.runtime.devices import probe_gpus

    gpus = len(probe_gpus().devices)
    if gpus >= 2:
        return "cuda:0", "cuda:1"
    return ("cuda:0", "cuda:0") if gpus == 1 else ("host", "host")


def _device_name(args: argparse.Namespace) -> str:
    if not args.src.startswith("cuda"):
        return ""
    from asynccube._core.cuda.driver import list_devices

    devs = list_devices()
    return f"{args.src} -> {args.dst} of {len(devs)}x {devs[0].split(None, 1)[1]}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", help="default: cuda:0 (host without a GPU)")
    p.add_argument("--dst", help="default: cuda:1 with two GPUs, else --src's device")
    p.add_argument("--sizes", help="comma-separated sizes in KiB (default: powers of 4)")
    p.add_argument("--max-mib", type=int, help="largest size (default 1024; 64 on the host)")
    p.add_argument("--batch-mib", type=int, help="bytes per timed batch (4096; 256 on the host)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--spin-ms", type=float, default=100.0, help="the ordering check's slow kernel")
    p.add_argument("--json-only", action="store_true", help="print, write nothing")
    args = p.parse_args(argv)
    if args.src is None or args.dst is None:
        src, dst = _default_pair()
        args.src, args.dst = args.src or src, args.dst or dst
    host = not args.src.startswith("cuda") and not args.dst.startswith("cuda")
    args.max_mib = args.max_mib or (64 if host else 1024)
    args.batch_mib = args.batch_mib or (256 if host else 4096)
    if args.runs < 1 or args.max_mib < 1 or args.batch_mib < 1 or args.spin_ms <= 0:
        p.error("--runs, --max-mib, --batch-mib and --spin-ms must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        figs = asyncio.run(measure(args))
    except ac.DeviceError as exc:  # a second GPU asked for where there is one
        print(f"bench_peer: {exc}", file=sys.stderr)
        return 2
    figs["args"] = vars(args)
    body = render(figs)
    print(body)
    if args.json_only:
        print(json.dumps(figs))
    else:
        host = not args.src.startswith("cuda")
        env = environment(_device_name(args))
        env["torch"] = figs["torch"] or "-"
        top = size_name(sizes(args)[-1])
        title = f"to_client from {figs['src']} to {figs['dst']}, a curve up to {top} (issue 32)"
        write("peer_host" if host else "peer", title, env, body, figs)
    ok = figs["ordering"]["data_ok"] and all(all(r["checked"].values()) for r in figs["sizes"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
