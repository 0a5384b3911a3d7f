"""Profile asynccube's per-command hot path on a GPU: where the µs per command go.

Run on the GPU machine (``scripts/gpu-check python3 benchmarks/profile_hot_path.py ...``):

    profile_hot_path.py [--loop asyncio|uvloop] [--only a,b] [--cprofile DIR]
                        [--seconds S] [--breakdown]

Scenarios: ``execute_unchecked``, ``execute_checked`` (4-arg kernel, fire-and-forget),
``read_1KiB`` (await a 1 KiB read), ``sync_after_launch`` (empty kernel, then await
sync), ``empty_drop_1MiB`` (``client.empty`` of a pool hit, dropped). Prints µs per
command for each. ``--cprofile DIR`` writes one pstats text file per scenario (sorted by
own time); ``--seconds S`` repeats each scenario for S seconds (for a sampling profiler
such as ``py-spy record --native``); ``--breakdown`` times the layers below the client
directly (server.execute, ArgPacker, MultiStream.resolve, the bare driver call).
``--fold FILE [--us X]`` (no GPU needed) summarizes a py-spy ``--format raw`` file.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import pstats
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import asynccube as ac  # noqa: E402

MiB = 1 << 20
SRC = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void empty_kernel() {}
"""


class Ctx:
    """A client with the buffers and kernels every scenario uses."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.add = ac.Kernel("prof_add", cuda=ac.CudaSource(SRC, "add", (256, 1, 1)))
        self.empty = ac.Kernel("prof_empty", cuda=ac.CudaSource(SRC, "empty_kernel", (1, 1, 1)))
        n = 4096
        self.bufs = [client.create(np.ones(n, np.float32)) for _ in range(2)] + [
            client.empty(4 * n)
        ]
        self.bindings = (
            ac.Bindings().with_buffers([h.binding() for h in self.bufs]).with_scalar(np.uint32, [n])
        )
        self.count = ac.CubeCount(n // 256)
        self.one = ac.CubeCount(1)
        self.none = ac.Bindings()
        self.small = client.create(bytes(1024))

    async def warm(self) -> None:
        c = self.client
        c.execute(self.add, self.count, self.bindings)
        c.execute(self.empty, self.one, self.none)
        await c.read([self.small])
        await c.sync()


async def _execute(ctx: Ctx, n: int, mode: ac.ExecutionMode) -> float:
    c, add, count, b = ctx.client, ctx.add, ctx.count, ctx.bindings
    t0 = time.perf_counter()
    for _ in range(n):
        c.execute(add, count, b, mode)
    await c.sync()
    return (time.perf_counter() - t0) / n * 1e6


async def execute_unchecked(ctx: Ctx, n: int) -> float:
    return await _execute(ctx, n, ac.ExecutionMode.UNCHECKED)


async def execute_checked(ctx: Ctx, n: int) -> float:
    return await _execute(ctx, n, ac.ExecutionMode.CHECKED)


async def read_1kib(ctx: Ctx, n: int) -> float:
    c, h = ctx.client, [ctx.small]
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        await c.read(h)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


async def sync_after_launch(ctx: Ctx, n: int) -> float:
    c, k, one, b, mode = ctx.client, ctx.empty, ctx.one, ctx.none, ac.ExecutionMode.UNCHECKED
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.execute(k, one, b, mode)
        await c.sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


async def empty_drop_1mib(ctx: Ctx, n: int) -> float:
    c = ctx.client
    t0 = time.perf_counter()
    for _ in range(n):
        h = c.empty(MiB)
        del h
    await c.memory_usage()
    return (time.perf_counter() - t0) / n * 1e6


Scenario = Callable[[Ctx, int], Awaitable[float]]
SCENARIOS: dict[str, tuple[Scenario, int]] = {
    "execute_unchecked": (execute_unchecked, 20000),
    "execute_checked": (execute_checked, 20000),
    "read_1KiB": (read_1kib, 2000),
    "sync_after_launch": (sync_after_launch, 2000),
    "empty_drop_1MiB": (empty_drop_1mib, 20000),
}


async def _profiled(name: str, fn: Scenario, ctx: Ctx, n: int, dest: Path, loop: str) -> float:
    prof = cProfile.Profile()
    prof.enable()
    us = await fn(ctx, n)
    prof.disable()
    _save(prof, dest / f"cprofile-{loop}-{name}.txt", f"# {name} on {loop}: {n} commands, "
          f"{us:.2f} us/command under cProfile\n")  # fmt: skip
    return us


def _save(prof: cProfile.Profile, path: Path, head: str) -> None:
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + text.getvalue())


async def breakdown(ctx: Ctx, reps: int = 20000) -> dict[str, float]:
    """The layers under ``client.execute``, each timed alone (µs per call)."""
    client = ctx.client
    server = client.server
    sid = ac.StreamId.current()
    await client.sync()
    loaded = server._kernels[ctx.add.id]
    bindings, count, mode = ctx.bindings, ctx.count, ac.ExecutionMode.UNCHECKED
    out: dict[str, float] = {}

    def per_call(fn: Callable[[], object]) -> float:
        best = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best.append((time.perf_counter() - t0) / reps * 1e6)
            server.end_batch()
        return min(best)

    execute = server.execute
    add, checked = ctx.add, ac.ExecutionMode.CHECKED
    out["server.execute UNCHECKED"] = per_call(lambda: execute(add, count, bindings, mode, sid))
    out["server.execute CHECKED"] = per_call(lambda: execute(add, count, bindings, checked, sid))
    ptr = server._ptr
    out["3 x server._ptr"] = per_call(lambda: [ptr(b) for b in bindings.buffers])
    packer = server._packer
    out["ArgPacker.get"] = per_call(lambda: packer.get(bindings))
    pack, scalars = packer.get(bindings)
    ptrs = [ptr(b) for b in bindings.buffers]
    out["ArgPack.pack"] = per_call(lambda: pack.pack(ptrs, scalars, None, ()))
    streams = server._streams
    out["MultiStream.resolve"] = per_call(lambda: streams.resolve(sid, bindings.buffers))
    out["StreamId.current"] = per_call(ac.StreamId.current)
    resolved = streams.resolve(sid, bindings.buffers)
    params = pack.pack(ptrs, scalars, None, ())
    launch, fn, s = server._launch, loaded.function, resolved.stream
    out["bare cuLaunchKernel (bindings, packed)"] = per_call(
        lambda: launch(fn, 16, 1, 1, 256, 1, 1, 0, s, params, 0)
    )
    await client.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        client.execute(ctx.add, count, bindings, mode)
    out["client.execute UNCHECKED enqueue"] = (time.perf_counter() - t0) / reps * 1e6
    await client.sync()
    ts = []
    for _ in range(2200):
        t0 = time.perf_counter()
        done = server.sync(sid)
        done.wait(None)
        done.result()
        ts.append(time.perf_counter() - t0)
    out["server.sync + blocking wait, idle stream"] = statistics.median(ts[200:]) * 1e6
    return out


async def main_async(args: argparse.Namespace) -> None:
    only = args.only.split(",") if args.only else list(SCENARIOS)
    async with ac.open_client("cuda:0") as client:
        ctx = Ctx(client)
        await ctx.warm()
        for name in only:
            fn, n = SCENARIOS[name]
            await fn(ctx, n // 10)
            if args.cprofile:
                us = await _profiled(name, fn, ctx, n, Path(args.cprofile), args.loop)
                print(f"{args.loop:8} {name:20} {us:9.2f} us/command (cProfile)", flush=True)
                continue
            deadline = time.perf_counter() + args.seconds
            runs = []
            while True:
                runs.append(await fn(ctx, n))
                if time.perf_counter() >= deadline:
                    break
            fast = getattr(client, "_fast", None)  # launches taken in one call / declined
            taken = f", FastLaunch taken/declined {tuple(fast.stats)}" if fast is not None else ""
            print(f"{args.loop:8} {name:20} {min(runs):9.2f} us/command ({len(runs)} runs{taken})")
        if args.breakdown:
            for key, v in (await breakdown(ctx)).items():
                print(f"{args.loop:8} breakdown  {key:40} {v:8.2f} us", flush=True)


SETUP_FRAMES = (
    "open_client",
    "_find_and_load",
    "Ctx.warm",
    "Ctx.__init__",
    "breakdown",
    "__aexit__",
)


def _frame(f: str) -> str:
    """``func (file:line)`` -> ``func (file)``; bare native addresses -> ``[native lib]``."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", f)
    name = f"{m.group(1)} ({m.group(2)})" if m else f
    return re.sub(r"^0x[0-9a-f]+ \((.*)\)$", r"[native \1]", name)


def fold(path: Path, us: float = 0.0, top: int = 40) -> str:
    """Own and inclusive share per function from a py-spy ``--format raw`` file, for
    samples on the running loop outside setup (imports, open_client, warm-up); with
    ``us`` (the scenario's µs per command without the profiler), shares become µs."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "Runner.run (asyncio/runners" not in stack or any(k in stack for k in SETUP_FRAMES):
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    scale = us or 100.0
    unit = "us/command" if us else "%"
    lines = [f"# {path.name}: {total} samples in the timed loop; {unit}", "", "# own"]
    lines += [f"{scale * c / total:7.2f}  {f}" for f, c in own.most_common(top)]
    lines += ["", "# inclusive"]
    lines += [f"{scale * c / total:7.2f}  {f}" for f, c in incl.most_common(top)]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    p.add_argument("--only", default="")
    p.add_argument("--cprofile", default="")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--fold", default="")
    p.add_argument("--us", type=float, default=0.0)
    args = p.parse_args()
    if args.fold:
        print(fold(Path(args.fold), args.us))
        return
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main_async(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
