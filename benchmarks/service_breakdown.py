"""The small service workload's asynccube calls without HTTP, one phase at a time.

Each variant runs ``--requests`` iterations split over ``--tasks`` concurrent tasks on
one loop and reports, per iteration, the wall time and the loop thread's CPU time
(``time.thread_time`` on the loop's thread: asynccube's workers and the driver's
threads are not counted). Variants (the small workload: 256 KiB float32 in and out):

* ``numpy``: ``frombuffer``, ``2x + 1``, ``tobytes`` on the loop (the floor, no device);
* ``create``: ``client.create(body)`` (a sync at each task's end);
* ``launch``: ``create`` + ``empty`` + ``execute``;
* ``read``: ``await client.read([y])`` of a handle made once;
* ``read_into``: ``await client.read_into(y, out)`` into a buffer made once;
* ``full``: the service's handler, ``create`` + ``empty`` + ``execute`` + ``read``;
* ``full_into``: the same, reading into a buffer made once per task.

Only public API that has existed since the issue was written is used, so the script
also runs against older trees (``PYTHONPATH=old/src``); a variant an older tree lacks
prints ``n/a``. ``--profile VARIANT`` adds a cProfile of that variant (top entries by
own time).

    python benchmarks/service_breakdown.py --device cuda:0 --tasks 1,64
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _service_work import Workload, asynccube_parts, workload

Step = Callable[[int], Awaitable[None]]


async def _run(step_for: Callable[[], Awaitable[Step]], tasks: int, requests: int,
               done: Callable[[], Awaitable[None]]) -> tuple[float, float]:  # fmt: skip
    steps = [await step_for() for _ in range(tasks)]
    per = max(1, requests // tasks)

    async def one(step: Step) -> None:
        for i in range(per):
            await step(i)
        await done()

    gc.collect()
    w0, c0 = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(one(s) for s in steps))
    w1, c1 = time.perf_counter(), time.thread_time()
    n = per * tasks
    return (w1 - w0) / n * 1e6, (c1 - c0) / n * 1e6


def _variants(p: Any, work: Workload, body: bytes) -> dict[str, Callable[[], Awaitable[Step]]]:
    client, nbytes = p.client, p.nbytes

    def launch(data: Any) -> Any:
        x = client.create(data)
        y = client.empty(nbytes)
        client.execute(p.kernel, p.count, p.bindings(x, y))
        return y

    async def out_buffer(kind: str | None) -> Any:
        """Where a read lands: None (new ``bytes``), a ``bytearray`` or a staging buffer."""
        if kind is None:
            return None
        if not hasattr(client, "read_into"):
            raise NotImplementedError  # an older tree
        return (await client.staging([nbytes]))[0] if kind == "pinned" else bytearray(nbytes)

    async def fetch(y: Any, out: Any) -> None:
        await (client.read([y]) if out is None else client.read_into(y, out))

    def plain(fn: Callable[[], Any]) -> Callable[[], Awaitable[Step]]:
        async def make() -> Step:
            async def step(i: int) -> None:
                fn()

            return step

        return make

    def read_only(kind: str | None) -> Callable[[], Awaitable[Step]]:
        async def make() -> Step:
            y, out = client.create(body), await out_buffer(kind)

            async def step(i: int) -> None:
                await fetch(y, out)

            return step

        return make

    def full(kind: str | None, pinned_in: bool = False) -> Callable[[], Awaitable[Step]]:
        async def make() -> Step:
            out = await out_buffer(kind)
            inp = (await client.staging([nbytes]))[0] if pinned_in else None

            async def step(i: int) -> None:
                if inp is not None:
                    inp[:] = np.frombuffer(body, np.uint8)
                await fetch(launch(body if inp is None else inp), out)

            return step

        return make

    return {
        "numpy": plain(lambda: work.host(np.frombuffer(body, np.float32)).tobytes()),
        "create": plain(lambda: client.create(body)),
        "launch": plain(lambda: launch(body)),
        "read": read_only(None),
        "read_into": read_only("bytearray"),
        "read_into_pinned": read_only("pinned"),
        "full": full(None),
        "full_into": full("bytearray"),
        "full_pinned": full("pinned"),
        "pinned_both": full("pinned", pinned_in=True),
    }


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="host")
    ap.add_argument("--tasks", default="1,64")
    ap.add_argument("--requests", type=int, default=6400)
    ap.add_argument("--variants", default="numpy,create,launch,read,read_into,full,full_into")
    ap.add_argument("--profile", default="", help="a variant to profile")
    ap.add_argument("--profile-tasks", type=int, default=64)
    ap.add_argument("--label", default="")
    ap.add_argument("--calls", action="store_true", help="also time each call alone")
    ap.add_argument(
        "--spin-us",
        type=float,
        default=None,
        help="experiment: the completion watcher's spin (default: the client's)",
    )
    ap.add_argument("--sort", default="tottime", help="the profile's order")
    args = ap.parse_args(argv)
    work = workload("small")
    stack: list[Any] = []
    p = await asynccube_parts(work, args.device, stack)
    body = work.inputs(1)[0]
    if args.spin_us is not None:
        p.client._channel.watcher._sync_spin = args.spin_us * 1e-6
    table = _variants(p, work, body)

    async def done() -> None:
        await p.client.sync()

    print(f"# {args.label or 'asynccube'} on {p.client.device}: us per iteration (wall / loop CPU)")
    tasks = [int(t) for t in args.tasks.split(",")]
    print("| variant | " + " | ".join(f"{t} tasks" for t in tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    for name in args.variants.split(","):
        cells = []
        try:
            await _run(table[name], 4, 256, done)  # warm-up
            for t in tasks:
                w, c = await _run(table[name], t, args.requests, done)
                cells.append(f"{w:.1f} / {c:.1f}")
        except NotImplementedError:
            cells = ["n/a"] * len(tasks)
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        w, c = await _run(table[args.profile], args.profile_tasks, args.requests, done)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(args.sort).print_stats(60)
        tasks_n = args.profile_tasks
        print(f"\n## cProfile of {args.profile}, {tasks_n} tasks ({w:.1f} us per iteration)")
        print(s.getvalue())
    if args.calls:
        await calls(p, body)
    for c in stack:
        await c.close()


async def calls(p: Any, body: bytes, n: int = 2000) -> None:
    """Each call of the handler alone, one task: the median time of each, in µs."""
    client, kernel, count, nbytes = p.client, p.kernel, p.count, p.nbytes
    pc = time.perf_counter_ns
    small = body[:1024]
    rows: dict[str, list[int]] = {}

    def note(name: str, t0: int) -> None:
        rows.setdefault(name, []).append(pc() - t0)

    out = bytearray(nbytes)
    for _ in range(n):
        t = pc()
        x = client.create(body)
        note("create 256K bytes", t)
        t = pc()
        client.create(small)
        note("create 1K bytes", t)
        t = pc()
        y = client.empty(nbytes)
        note("empty", t)
        t = pc()
        b = p.bindings(x, y)
        note("bindings", t)
        t = pc()
        client.execute(kernel, count, b)
        note("execute", t)
        t = pc()
        fut = client.read([y])
        note("read 256K: call", t)
        await fut
        note("read 256K: call to result", t)
        t = pc()
        await client.read([x.binding()])
        note("read 256K again (idle)", t)
        if hasattr(client, "read_into"):
            t = pc()
            await client.read_into(y, out)
            note("read_into 256K bytearray", t)
        small_h = client.create(small)
        await client.sync()
        t = pc()
        await client.read([small_h])
        note("read 1K (idle)", t)
        t = pc()
        await client.sync()
        note("sync (idle)", t)
        t = pc()
        bytes(body)
        note("bytes(256K) copy", t)
    print("\n| call (one task) | median us |\n|---|---|")
    for name, ts in rows.items():
        ts.sort()
        print(f"| {name} | {ts[len(ts) // 2] / 1000:.1f} |")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
