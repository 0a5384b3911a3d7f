"""Where a request's time goes (issue 38): ``bench_requests``' request, taken apart.

For each task count (``--tasks``, 1 and 64 by default), on the chosen device and loop:

1. **Phases.** The request with a clock around each of its calls: ``create``, ``empty``,
   building the ``Bindings``, ``execute``, the ``read`` call, and the ``await`` of the
   read; µs per request each, beside the wall time and the loop thread's CPU per
   request. The calls before the await never suspend: their time is the loop thread's
   own (with the commands they run inline). The await's time overlaps other tasks' at
   more than one task; *rest of the loop* is the wall time per request outside the
   requests' own calls: the actor's drains of queued commands, completions, the loop.
2. **cProfile** of the same run (the loop thread only): the calls per request (Python
   functions and built-ins), the top functions by own time, own time by source file,
   and counters per request (loop iterations, actor drains, commands run inline or
   queued, completions, wake-ups from other threads, calls that took the Python route).
   cProfile roughly doubles the time of a call: read the ratios, not the absolute µs.
3. On CUDA, the one-call routes (``FastLaunch``'s ``empty``, launch and small read):
   offers taken and declined per request.

``--fake-cuda`` runs the CUDA server over ``bench_overhead.py``'s no-op driver (no GPU
needed: the CUDA path's own work and its route choices; answers are not checked).

    python benchmarks/profile_requests.py --device host --tasks 1,64
    python benchmarks/profile_requests.py --fake-cuda --tasks 1,8,64,256
    python benchmarks/profile_requests.py --device cuda:0 --loop uvloop --size 1024
    python benchmarks/profile_requests.py --save benchmarks/profiles/requests/host.md
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import table
from bench_requests import (
    Request,
    Work,
    asynccube_request,
    default_device,
    measure,
    run_on,
    size_label,
    work_for,
    y2x1_kernel,
)

PHASES = ("create", "empty", "bindings", "execute", "read call", "await read (its wait)")
SYNC = 5
"""The phases before the await (the loop thread's own time)."""
COUNTERS = {
    "loop iterations (asyncio _run_once)": ("asyncio/base_events.py", "_run_once"),
    "Channel.send": ("channel/channel.py", "send"),
    "commands run inline (_run_inline)": ("channel/channel.py", "_run_inline"),
    "actor wake-ups (_wake)": ("channel/channel.py", "_wake"),
    "actor drains (_drain)": ("channel/channel.py", "_drain"),
    "batch ends (_end_batch)": ("channel/channel.py", "_end_batch"),
    "inline batch ends (_end_inline_batch)": ("channel/channel.py", "_end_inline_batch"),
    "futures made (new_future)": ("channel/awaitable.py", "new_future"),
    "completions watched (watch)": ("channel/completion.py", "watch"),
    "futures settled (_settle)": ("channel/settle.py", "_settle"),
    "allocations through the Python route (ClientMemory.mint)": ("client/memory.py", "mint"),
    "launches through the Python route (Launcher.launch)": ("client/launch.py", "launch"),
    "reads through the Python route (read_on_actor)": ("client/movement.py", "read_on_actor"),
    "StreamId.current": ("values/stream_id.py", "current"),
    "MultiStream.resolve": ("stream/multi.py", "resolve"),
    "worker submits (HostStream.submit)": ("host/worker.py", "submit"),
    "worker hand-overs (HostStream.flush)": ("host/worker.py", "flush"),
    "self-pipe reads (_read_from_self)": ("asyncio/selector_events.py", "_read_from_self"),
    "completion polls (_Watch._poll)": ("cuda/completion.py", "_poll"),
    "completion descriptors armed (_Watch._arm)": ("cuda/completion.py", "_arm"),
    "call_soon": ("asyncio/base_events.py", "call_soon"),
    "selector polls (select)": ("selectors.py", "select"),
}


def phased_request(client: Any, kernel: Any, work: Work, acc: list[float]) -> Request:
    """bench_requests' request with a clock around each call; seconds summed in ``acc``
    (one slot per phase of :data:`PHASES`)."""
    import asynccube as ac

    Bindings, n, nbytes = ac.Bindings, work.n, work.size
    count = ac.CubeCount((n + 255) // 256)
    pc = time.perf_counter

    async def request(body: bytes) -> bytes:
        t0 = pc()
        x = client.create(body)
        t1 = pc()
        y = client.empty(nbytes)
        t2 = pc()
        bindings = Bindings().with_buffers([x.binding(), y.binding()]).with_scalar(np.uint32, [n])
        t3 = pc()
        client.execute(kernel, count, bindings)
        t4 = pc()
        fut = client.read([y.binding()])
        t5 = pc()
        (out,) = await fut
        t6 = pc()
        acc[0] += t1 - t0
        acc[1] += t2 - t1
        acc[2] += t3 - t2
        acc[3] += t4 - t3
        acc[4] += t5 - t4
        acc[5] += t6 - t5
        return out  # type: ignore[no-any-return]

    return request


def _short(path: str) -> str:
    for mark in ("asynccube/_core/", "site-packages/", "/lib/python3"):
        at = path.find(mark)
        if at >= 0:
            rest = path[at + len(mark) :]
            return rest.split("/", 1)[1] if mark == "/lib/python3" else rest
    return path


def _area(key: tuple[str, int, str]) -> str:
    path, _, name = key
    if path == "~":
        return "built-ins: " + (name.split("'")[1] if "'" in name else name)
    return _short(path)


def fast_routes(client: Any) -> tuple[int, ...] | None:
    """The CUDA server's one-call routes' counters (``empty``, launch and small read
    offers taken inline, declined; launches taken from the actor's queue, declined
    there; ``create``'s writes taken, declined), or None (no such routes: the host
    server)."""
    fast = getattr(client, "_fast", None)
    if fast is None:
        return None
    return (*fast.stats, *fast.queued_stats, *fast.write_stats)


def profile_summary(prof: cProfile.Profile, n: int, top: int) -> str:
    """Calls per request, the top functions and files by own time, and the counters."""
    st = pstats.Stats(prof)
    entries: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    py_calls = sum(v[1] for k, v in entries.items() if k[0] != "~")
    builtin_calls = sum(v[1] for k, v in entries.items() if k[0] == "~")
    total_tt = sum(v[2] for v in entries.values())
    lines = [
        f"Calls per request: {st.total_calls / n:.0f} ({py_calls / n:.0f} Python functions, "  # type: ignore[attr-defined]
        f"{builtin_calls / n:.0f} built-ins); profiled own time {total_tt / n * 1e6:.1f} µs "
        "per request.",
        "",
    ]
    rows = []
    for key, (_, nc, tt, ct, _) in sorted(entries.items(), key=lambda kv: -kv[1][2])[:top]:
        path, line, name = key
        where = name if path == "~" else f"{_short(path)}:{line}({name})"
        rows.append([where, f"{tt / n * 1e6:.2f}", f"{ct / n * 1e6:.1f}", f"{nc / n:.2f}"])
    lines.append(table(["function", "own µs/req", "cumulative µs/req", "calls/req"], rows))
    areas: dict[str, list[float]] = {}
    for key, (_, nc, tt, _, _) in entries.items():
        got = areas.setdefault(_area(key), [0.0, 0.0])
        got[0] += tt
        got[1] += nc
    by_area = sorted(areas.items(), key=lambda kv: -kv[1][0])[:top]
    lines += ["", table(["file (own time)", "own µs/req", "share", "calls/req"], [
        [a, f"{tt / n * 1e6:.2f}", f"{tt / total_tt:.0%}", f"{nc / n:.1f}"]
        for a, (tt, nc) in by_area
    ])]  # fmt: skip
    counts = []
    for label, (suffix, func) in COUNTERS.items():
        calls = sum(v[1] for k, v in entries.items() if k[0].endswith(suffix) and k[2] == func)
        if calls:
            counts.append([label, f"{calls / n:.2f}"])
    lines += ["", table(["counter", "per request"], counts)]
    return "\n".join(lines)


async def _open(args: argparse.Namespace) -> Any:
    """A client on ``args.device``, or on the CUDA server over the no-op driver."""
    if not args.fake_cuda:
        import asynccube as ac

        return await ac.connect(args.device)
    import asyncio

    import bench_overhead

    from asynccube._core.client.client import ComputeClient

    return ComputeClient(bench_overhead._server(), asyncio.get_running_loop())


async def _profile(args: argparse.Namespace, backend: str) -> str:
    client = await _open(args)
    try:
        return await _profile_on(client, args, backend)
    finally:
        await client.close()


async def _profile_on(client: Any, args: argparse.Namespace, backend: str) -> str:
    """The phases, the routes taken and the profiles on ``client`` (markdown)."""
    work = work_for(args.size)
    kernel = y2x1_kernel()
    out = []
    check = not args.fake_cuda  # the no-op driver copies and computes nothing
    acc = [0.0] * len(PHASES)
    request = phased_request(client, kernel, work, acc)
    await measure(backend, request, work, 1, 64, check=check)  # compile, load, pools
    await measure(backend, request, work, 64, 256, check=check)
    phase_rows: list[list[str]] = []
    routes = []
    for tasks in args.tasks:
        acc[:] = [0.0] * len(PHASES)
        per = max(2, args.requests // tasks)
        before = fast_routes(client)
        wall, cpu = await measure(backend, request, work, tasks, args.requests, check=check)
        n = per * tasks
        after = fast_routes(client)
        if before is not None and after is not None:
            moved = [(a - b) / n for a, b in zip(after, before, strict=True)]
            routes.append([str(tasks), *(f"{m:.2f}" for m in moved)])
        us = [a / n * 1e6 for a in acc]
        sync = sum(us[:SYNC])
        phase_rows.append([str(tasks), *(f"{u:.1f}" for u in us), f"{sync:.1f}",
                           f"{wall - sync:.1f}", f"{wall:.1f}", f"{cpu:.1f}"])  # fmt: skip
    head = ["tasks", *PHASES, "calls before the await", "rest of the loop", "wall",
            "loop CPU"]  # fmt: skip
    out.append(f"### Phases, µs per request ({size_label(work.size)}, {backend}, "
               f"{args.device})\n\n" + table(head, phase_rows))  # fmt: skip
    if routes:
        out.append("The one-call routes (`FastLaunch`: `empty`, the launch, the small "
                   "read, four offers per request; `create`'s write, one), per request:"
                   "\n\n" + table(["tasks", "taken inline", "declined", "launches taken "
                            "from the actor's queue", "declined there", "writes taken",
                            "writes declined"], routes))  # fmt: skip
    plain = asynccube_request(client, kernel, work)
    for tasks in args.tasks:
        per = max(2, args.requests // tasks)
        gc.collect()
        prof = cProfile.Profile()
        prof.enable()
        wall, cpu = await measure(
            backend, plain, work, tasks, args.requests, collect=False, check=check
        )
        prof.disable()
        out.append(
            f"### cProfile, {tasks} task{'s' if tasks > 1 else ''} "
            f"({wall:.1f} µs per request under the profiler)\n\n"
            + profile_summary(prof, per * tasks, args.top)
        )
    return "\n\n".join(out)


def main(argv: Sequence[str] | None = None) -> str:
    """Print (and with ``--save``, write) the phases and the profiles."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="", help="host or cuda:N (default: cuda:0 if usable)")
    ap.add_argument("--loop", default="asyncio", choices=("asyncio", "uvloop", "trio"))
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--tasks", default="1,64")
    ap.add_argument("--requests", type=int, default=2048, help="requests per figure")
    ap.add_argument("--top", type=int, default=25, help="rows of each profile table")
    ap.add_argument("--save", default="", help="also write the report to this file")
    ap.add_argument(
        "--fake-cuda",
        action="store_true",
        help="the CUDA server over bench_overhead's no-op driver (no GPU needed: the "
        "CUDA path's own work and route choices; answers not checked)",
    )
    args = ap.parse_args(argv)
    if args.fake_cuda:
        if args.loop == "trio":
            ap.error("--fake-cuda runs under asyncio or uvloop")
        import bench_overhead

        bench_overhead.install_fake()  # before any CUDA server is built
        args.device = "cuda (no-op driver)"
    args.device = args.device or default_device()
    args.tasks = [int(t) for t in args.tasks.split(",") if t]
    body = run_on(args.loop, lambda: _profile(args, args.loop))
    text = (
        f"## Where the request's time goes: {size_label(args.size)} on {args.device}, "
        f"{args.loop}, {args.requests} requests per figure\n\n"
        f"Command: `python benchmarks/profile_requests.py {' '.join(sys.argv[1:])}`\n\n{body}\n"
    )
    print(text)
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(text)
    return text


if __name__ == "__main__":
    main()
