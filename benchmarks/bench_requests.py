"""The request as users write it (issue 38): asynccube beside its peers, per request.

A request, as a service handler writes it for a body of ``bytes`` (``n`` floats)::

    x = client.create(body)
    y = client.empty(len(body))
    bindings = ac.Bindings().with_buffers([x.binding(), y.binding()]).with_scalar(np.uint32, [n])
    client.execute(Y2X1, count, bindings)  # y = 2x + 1, float32 (_service_work.Y_SRC)
    (out,) = await client.read([y.binding()])

at 1 KiB, 64 KiB and 1 MiB bodies and 1, 8, 64 and 256 concurrent tasks: each task runs
its share of the requests in a loop, and a figure is the whole wall time over the
requests (µs per request) and the loop thread's CPU time over the requests
(``time.thread_time`` on the loop's thread: asynccube's workers and the driver's
threads are not counted). Under asyncio, uvloop (where importable) and trio (at 1 KiB).

Beside it, in the same run: numpy on the loop (``2 * a + 1`` of ``np.frombuffer(body)``,
no device) and, where the device is a GPU and they import, torch blocking
(``torch.from_numpy(a).cuda()``, ``2 * t + 1``, ``.cpu()``), CuPy blocking
(``cp.asarray(a)``, ``cp.empty_like``, a ``RawKernel`` of the same source, ``.get()``),
CuPy with a non-blocking stream per worker thread (each request through
``asyncio.to_thread``, at every task count), and a C floor (``floor.c``'s request mode:
the same steps on the driver API, blocking, from C). The blocking peers run one request
at a time (1 task); the goals compare every row with the best of torch and CuPy
blocking. The peers' answer stays a host array (no ``tobytes``); asynccube's read
returns ``bytes``. Every first answer of a task is checked against numpy.

Each figure is the median of ``--runs`` runs (3; the loops and the peers alternate within
each run); every run's figure is in ``results/requests.json`` (``requests_host`` on the
host server). ``--quick``: one run, a quarter of the requests.

    python benchmarks/bench_requests.py                  # cuda:0 where usable, else host
    python benchmarks/bench_requests.py --device host --quick
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import environment, table, write
from _floor import SOURCE as FLOOR_SOURCE
from _floor import _gcc
from _service_work import Y_SRC, _host_y2x1

SIZES = (1024, 64 * 1024, 1 << 20)
TASKS = (1, 8, 64, 256)
LOOPS = ("asyncio", "uvloop", "trio")
TRIO_SIZES = (1024,)
"""The body sizes run under trio (one: trio's cost beside asyncio's, not a grid)."""
REQUESTS = {1024: 4096, 64 * 1024: 2048, 1 << 20: 1024}
"""Requests per figure (``--quick``: a quarter); each task runs at least 2."""
BODIES = 4
"""Distinct bodies per size; task ``i`` sends body ``i % BODIES``."""
BLOCKING = ("torch", "cupy")
"""The blocking peers the goals compare with (the best of them)."""
GOAL_1 = 0.9
GOAL_64 = {1024: 0.5, 64 * 1024: 0.5, 1 << 20: 0.8}
GOAL_CPU_US = 25.0
"""The loop thread's CPU per 1 KiB request at 64 tasks (µs)."""

Request = Callable[[bytes], Awaitable[Any]]
Key = tuple[int, int]
"""(body bytes, tasks)."""
Fig = tuple[float, float]
"""(µs, the loop thread's CPU µs) per request."""


class Unavailable(Exception):
    """A peer that cannot run here (the reason is the message)."""


class WrongAnswer(AssertionError):
    """A request's answer differs from numpy's."""


def size_label(size: int) -> str:
    """``1 KiB``, ``64 KiB``, ``1 MiB``."""
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


@dataclass
class Work:
    """One body size: its bodies (float32 bytes) and their answers ``2x + 1``."""

    size: int
    bodies: list[bytes]
    want: list[bytes]

    @property
    def n(self) -> int:
        """Floats in a body."""
        return self.size // 4


def work_for(size: int) -> Work:
    """:data:`BODIES` random bodies of ``size`` bytes and their answers."""
    rng = np.random.default_rng(size)
    arrays = [rng.standard_normal(size // 4).astype(np.float32) for _ in range(BODIES)]
    two, one = np.float32(2), np.float32(1)
    return Work(size, [a.tobytes() for a in arrays], [(a * two + one).tobytes() for a in arrays])


def _as_bytes(out: Any) -> bytes:
    return out if isinstance(out, bytes) else np.asarray(out).tobytes()


def y2x1_kernel() -> Any:
    """The request's kernel: ``y = 2x + 1`` (CUDA source and its numpy host half)."""
    import asynccube as ac

    cuda = ac.CudaSource(Y_SRC, "y2x1", (256, 1, 1))
    return ac.Kernel("bench_requests_y2x1", cuda=cuda, host=_host_y2x1)


def asynccube_request(client: Any, kernel: Any, work: Work) -> Request:
    """The request as users write it (see the module docstring), on ``client``."""
    import asynccube as ac

    Bindings, n, nbytes = ac.Bindings, work.n, work.size
    count = ac.CubeCount((n + 255) // 256)

    async def request(body: bytes) -> bytes:
        x = client.create(body)
        y = client.empty(nbytes)
        bindings = Bindings().with_buffers([x.binding(), y.binding()]).with_scalar(np.uint32, [n])
        client.execute(kernel, count, bindings)
        (out,) = await client.read([y.binding()])
        return out  # type: ignore[no-any-return]

    return request


# -- running tasks on a loop ------------------------------------------------------------


async def spawn(backend: str, jobs: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` concurrently and wait for all (a trio nursery, or ``gather``)."""
    if backend == "trio":
        import trio

        async with trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(job)
        return
    await asyncio.gather(*(job() for job in jobs))


async def measure(
    backend: str,
    request: Request,
    work: Work,
    tasks: int,
    requests: int,
    collect: bool = True,
    check: bool = True,
) -> tuple[float, float]:
    """(µs, loop-thread CPU µs) per request: ``tasks`` tasks, each running its share of
    ``requests`` (at least 2) in a loop; each task's first answer is checked once the
    clock has stopped (unless ``check`` is False: a driver that computes nothing).
    ``collect``: a full garbage collection first (outside the clock)."""
    per = max(2, requests // tasks)
    first: list[Any] = [None] * tasks

    def job_for(i: int) -> Callable[[], Awaitable[None]]:
        body = work.bodies[i % BODIES]

        async def job() -> None:
            first[i] = await request(body)
            for _ in range(per - 1):
                await request(body)

        return job

    jobs = [job_for(i) for i in range(tasks)]
    if collect:
        gc.collect()
    w0, c0 = time.perf_counter(), time.thread_time()
    await spawn(backend, jobs)
    w1, c1 = time.perf_counter(), time.thread_time()
    for i, out in enumerate(first if check else ()):
        if _as_bytes(out) != work.want[i % BODIES]:
            raise WrongAnswer(f"{size_label(work.size)}, task {i}: wrong answer")
    n = per * tasks
    return (w1 - w0) / n * 1e6, (c1 - c0) / n * 1e6


def run_on(backend: str, main: Callable[[], Awaitable[Any]]) -> Any:
    """``main()`` run under ``backend``; raises Unavailable where it is not installed."""
    if backend == "asyncio":
        return asyncio.run(main())  # type: ignore[arg-type]
    if backend == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise Unavailable("uvloop is not installed") from None
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main())  # type: ignore[arg-type]
    try:
        import trio
    except ImportError:
        raise Unavailable("trio is not installed") from None
    return trio.run(main)


# -- asynccube ------------------------------------------------------------------------


@dataclass
class Plan:
    """What one run measures."""

    device: str
    works: list[Work]
    tasks: list[int]
    requests: dict[int, int]
    loops: list[str]
    trio_sizes: tuple[int, ...] = TRIO_SIZES
    command: str = ""
    """The command line that ran it (for the report)."""

    def sizes_for(self, backend: str) -> list[Work]:
        """The bodies ``backend`` runs (trio: :data:`TRIO_SIZES` only)."""
        if backend != "trio":
            return self.works
        return [w for w in self.works if w.size in self.trio_sizes] or self.works[:1]


async def asynccube_figures(plan: Plan, backend: str) -> dict[Key, tuple[float, float]]:
    """Every (size, tasks) figure of asynccube under ``backend`` (one client)."""
    import asynccube as ac

    kernel = y2x1_kernel()
    out: dict[Key, tuple[float, float]] = {}
    async with ac.open_client(plan.device) as client:
        for work in plan.sizes_for(backend):
            request = asynccube_request(client, kernel, work)
            await measure(backend, request, work, 1, 64)  # compile, load, pools
            most = max(plan.tasks)  # the pools' pages for the most buffers alive at once
            await measure(backend, request, work, most, 2 * most)
            for tasks in plan.tasks:
                out[(work.size, tasks)] = await measure(
                    backend, request, work, tasks, plan.requests[work.size]
                )
    return out


# -- peers ------------------------------------------------------------------------------


def _gpu_index(device: str) -> int:
    if not device.startswith("cuda"):
        raise Unavailable("needs a GPU; this run uses the host server")
    return int(device.split(":")[1]) if ":" in device else 0


def torch_peer(device: str, work: Work) -> Callable[[bytes], Any]:
    """torch blocking: ``from_numpy(a).cuda()``, ``2 * t + 1``, ``.cpu()``."""
    index = _gpu_index(device)
    try:
        import torch
    except ImportError:
        raise Unavailable("torch is not installed") from None
    if not torch.cuda.is_available():
        raise Unavailable("torch.cuda.is_available() is False")
    dev = torch.device("cuda", index)
    # a body's array is read-only (np.frombuffer of bytes): torch warns once, and reads it
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def one(body: bytes) -> Any:
        t = torch.from_numpy(np.frombuffer(body, np.float32)).to(dev)
        return (2 * t + 1).cpu()

    return one


def cupy_peer(device: str, work: Work, streams: bool) -> Callable[[bytes], Any]:
    """CuPy: ``asarray``, ``empty_like``, the RawKernel, ``.get()``; with ``streams``,
    each worker thread on its own non-blocking stream."""
    cp, gpu = cupy_device(device)
    with gpu:
        kern = cp.RawKernel(Y_SRC, "y2x1")
    n = np.uint32(work.n)
    grid, block = ((work.n + 255) // 256,), (256,)

    def one(body: bytes) -> Any:
        x = cp.asarray(np.frombuffer(body, np.float32))
        y = cp.empty_like(x)
        kern(grid, block, (x, y, n))
        return y.get()

    return cupy_calls(gpu, one, streams)


def cupy_device(device: str) -> tuple[Any, Any]:
    """(the cupy module, the ``cupy.cuda.Device`` of ``device``); Unavailable without
    a GPU or CuPy."""
    index = _gpu_index(device)
    try:
        import cupy as cp
    except ImportError:
        raise Unavailable("cupy is not installed") from None
    return cp, cp.cuda.Device(index)


def cupy_calls(gpu: Any, one: Callable[[bytes], Any], streams: bool) -> Callable[[bytes], Any]:
    """``one`` called on ``gpu`` from the calling thread (``gpu.use()``), or with
    ``streams`` on a non-blocking stream of each worker thread's own."""
    import cupy as cp

    if not streams:
        gpu.use()  # the calling thread's device, as a one-GPU program has it
        return one
    local = threading.local()

    def on_stream(body: bytes) -> Any:
        stream = getattr(local, "stream", None)
        if stream is None:
            with gpu:
                stream = local.stream = cp.cuda.Stream(non_blocking=True)
        with gpu, stream:
            return one(body)

    return on_stream


def measure_blocking(fn: Callable[[bytes], Any], work: Work, requests: int) -> tuple[float, float]:
    """(µs, CPU µs) per request of a blocking peer, one request at a time."""
    for i in range(BODIES):
        if _as_bytes(fn(work.bodies[i])) != work.want[i]:
            raise WrongAnswer(f"{size_label(work.size)}: wrong answer")
    for i in range(32):
        fn(work.bodies[i % BODIES])
    bodies = [work.bodies[i % BODIES] for i in range(requests)]
    gc.collect()
    w0, c0 = time.perf_counter(), time.thread_time()
    for body in bodies:
        fn(body)
    w1, c1 = time.perf_counter(), time.thread_time()
    return (w1 - w0) / requests * 1e6, (c1 - c0) / requests * 1e6


def numpy_request(work: Work) -> Request:
    """numpy on the loop: ``2 * a + 1`` of the body's floats (no device)."""

    async def request(body: bytes) -> Any:
        return 2 * np.frombuffer(body, np.float32) + 1

    return request


def threaded_request(fn: Callable[[bytes], Any]) -> Request:
    """``fn`` in the loop's default executor (``asyncio.to_thread``)."""

    async def request(body: bytes) -> Any:
        return await asyncio.to_thread(fn, body)

    return request


async def loop_peer_figures(
    plan: Plan, requests_for: Callable[[Work], Request | None], tasks: Sequence[int]
) -> dict[Key, tuple[float, float]]:
    """A peer that runs on the asyncio loop, at each task count of ``tasks``."""
    out: dict[Key, tuple[float, float]] = {}
    for work in plan.works:
        request = requests_for(work)
        if request is None:
            continue
        await measure("asyncio", request, work, 8, 64)  # warm-up: threads, streams
        for t in tasks:
            out[(work.size, t)] = await measure(
                "asyncio", request, work, t, plan.requests[work.size]
            )
    return out


def c_floor(device: str, sizes: Sequence[int]) -> dict[int, float]:
    """floor.c's request mode on the same kernel's cubin: µs per request, each size."""
    _gpu_index(device)
    from asynccube._core.cuda.compiler import KernelCompiler
    from asynccube._core.cuda.driver import device_properties
    from asynccube._core.values.kernel import CudaSource

    arch = device_properties(_gpu_index(device)).extra["arch"]
    compiled = KernelCompiler().compile(CudaSource(Y_SRC, "y2x1", (256, 1, 1)), arch)
    tmp = Path(tempfile.mkdtemp(prefix="ac-request-floor-"))
    exe, blob = tmp / "floor", tmp / "y2x1.cubin"
    blob.write_bytes(compiled.cubin)
    error = _gcc(["-O2", "-DFLOOR_MAIN", str(FLOOR_SOURCE), "-ldl", "-o", str(exe)])
    if error:
        raise Unavailable(error)
    cmd = [str(exe), str(blob), "request", compiled.symbol, *(str(s) for s in sizes)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    try:
        got = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise Unavailable(f"floor exited {done.returncode}: {done.stderr.strip()[:300]}") from None
    if "error" in got:
        raise Unavailable(f"floor: {got['error']} (CUresult {got.get('code')})")
    return {int(k): float(v) for k, v in got["c_request_us"].items()}


@dataclass
class Results:
    """Every run's figures: ``series[name][(size, tasks)]`` is a list of (µs, CPU µs)."""

    series: dict[str, dict[Key, list[tuple[float, float]]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, figures: dict[Key, tuple[float, float]]) -> None:
        """One run's figures of ``name``."""
        into = self.series.setdefault(name, {})
        for key, fig in figures.items():
            into.setdefault(key, []).append(fig)

    def median(self, name: str, key: Key, which: int = 0) -> float | None:
        """The median over runs of µs (``which`` 0) or CPU µs (1), or None."""
        figs = self.series.get(name, {}).get(key)
        return statistics.median(f[which] for f in figs) if figs else None


def _peers(plan: Plan, results: Results) -> dict[str, dict[int, Callable[[bytes], Any]]]:
    """The GPU peers' callables per body size (made once: imports, compiles), the ones
    that cannot run here noted in ``results.skipped``."""
    makers: dict[str, Callable[[Work], Callable[[bytes], Any]]] = {
        "torch": lambda w: torch_peer(plan.device, w),
        "cupy": lambda w: cupy_peer(plan.device, w, streams=False),
        "cupy_threads": lambda w: cupy_peer(plan.device, w, streams=True),
    }
    peers: dict[str, dict[int, Callable[[bytes], Any]]] = {}
    for name, make in makers.items():
        try:
            peers[name] = {w.size: make(w) for w in plan.works}
        except Unavailable as why:
            results.skipped[name] = str(why)
        except Exception as exc:  # a peer's own failure: noted, the rest still runs
            results.skipped[name] = f"{type(exc).__name__}: {exc}"[:300]
    return peers


def _peer_figures(results: Results, name: str, measure_all: Callable[[], dict[Key, Fig]]) -> None:
    """A peer's figures of this run; a peer that fails (a wrong answer included) is
    noted as skipped, and left out of the later runs."""
    if name in results.skipped:
        return
    try:
        results.add(name, measure_all())
    except Exception as exc:
        results.skipped[name] = f"{type(exc).__name__}: {exc}"[:300]


def _blocking_figures(plan: Plan, fns: dict[int, Callable[[bytes], Any]]) -> dict[Key, Fig]:
    """A blocking peer at each body size, one request at a time."""
    return {(w.size, 1): measure_blocking(fns[w.size], w, plan.requests[w.size])
            for w in plan.works}  # fmt: skip


def _threaded_figures(plan: Plan, fns: dict[int, Callable[[bytes], Any]]) -> dict[Key, Fig]:
    """A peer run through ``asyncio.to_thread`` at each body size and task count."""

    def requests_for(w: Work) -> Request:
        return threaded_request(fns[w.size])

    figures: dict[Key, Fig] = run_on(
        "asyncio", lambda: loop_peer_figures(plan, requests_for, plan.tasks)
    )
    return figures


def one_run(plan: Plan, results: Results, peers: dict[str, dict[int, Any]], floor: bool) -> None:
    """Every figure once: asynccube under each loop, then each peer."""
    for backend in plan.loops:
        if backend in results.skipped:
            continue
        try:
            results.add(backend, run_on(backend, lambda b=backend: asynccube_figures(plan, b)))
        except Unavailable as why:
            results.skipped[backend] = str(why)
        print(f"  asynccube {backend} done", file=sys.stderr, flush=True)
    results.add("numpy", run_on("asyncio", lambda: loop_peer_figures(plan, numpy_request, [1])))
    for name in BLOCKING:
        if name in peers:
            _peer_figures(results, name, functools.partial(_blocking_figures, plan, peers[name]))
    if "cupy_threads" in peers:
        threaded = functools.partial(_threaded_figures, plan, peers["cupy_threads"])
        _peer_figures(results, "cupy_threads", threaded)
    if floor and "c_floor" not in results.skipped:
        try:
            us = c_floor(plan.device, [w.size for w in plan.works])
            results.add("c_floor", {(s, 1): (v, v) for s, v in us.items()})
        except Exception as why:  # Unavailable, or the compile or the program failing
            results.skipped["c_floor"] = str(why)[:300]
    print("  peers done", file=sys.stderr, flush=True)


# -- the report ---------------------------------------------------------------------


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _best_blocking(results: Results, size: int) -> tuple[str, float] | None:
    """The fastest blocking GPU peer at ``size`` (name, µs); numpy on the loop where
    none ran (the host server)."""
    got = [(name, results.median(name, (size, 1))) for name in BLOCKING]
    found = [(name, v) for name, v in got if v is not None]
    if not found:
        numpy = results.median("numpy", (size, 1))
        return ("numpy", numpy) if numpy is not None else None
    return min(found, key=lambda nv: nv[1])


def _goal(size: int, tasks: int, ratio: float | None, falls: bool | None) -> str:
    if ratio is None:
        return "-"
    if tasks == 1:
        return f"<= {GOAL_1}x: {'met' if ratio <= GOAL_1 else 'missed'}"
    if tasks == 64:
        goal = GOAL_64.get(size, 0.8)
        ok = ratio <= goal and bool(falls)
        return f"<= {goal}x and below 1 task: {'met' if ok else 'missed'}"
    return "-"


def report(plan: Plan, results: Results) -> tuple[str, dict[str, Any]]:
    """The markdown body (two tables and notes) and the JSON figures."""
    gpu = plan.device.startswith("cuda")
    loops = [b for b in plan.loops if b in results.series]
    head = ["body", "tasks", *(f"asynccube {b}" for b in loops), "CuPy stream per thread",
            "torch blocking", "CuPy blocking", "numpy on the loop", "C floor",
            "asyncio / best blocking peer", "goal"]  # fmt: skip
    rows, cpu_rows = [], []
    for work in plan.works:
        size = work.size
        best = _best_blocking(results, size)
        one_task = results.median("asyncio", (size, 1))
        for t in plan.tasks:
            key = (size, t)
            ours = results.median("asyncio", key)
            ratio = ours / best[1] if best and ours is not None else None
            falls = ours < one_task if ours is not None and one_task is not None else None
            at1 = t == 1
            rows.append([
                size_label(size), t, *(_fmt(results.median(b, key)) for b in loops),
                _fmt(results.median("cupy_threads", key)),
                *(_fmt(results.median(p, key)) if at1 else "" for p in
                  ("torch", "cupy", "numpy", "c_floor")),
                f"{ratio:.2f}x ({best[0]})" if ratio is not None and best else "-",
                _goal(size, t, ratio, falls) if gpu else "-",
            ])  # fmt: skip
            cpu = results.median("asyncio", key, 1)
            goal = "-"
            if gpu and size == 1024 and t == 64 and cpu is not None:
                goal = f"<= {GOAL_CPU_US:.0f}: {'met' if cpu <= GOAL_CPU_US else 'missed'}"
            cpu_rows.append([
                size_label(size), t, *(_fmt(results.median(b, key, 1)) for b in loops),
                _fmt(results.median("cupy_threads", key, 1)),
                *(_fmt(results.median(p, key, 1)) if at1 else "" for p in
                  ("torch", "cupy", "numpy")),
                goal,
            ])  # fmt: skip
    cpu_head = ["body", "tasks", *(f"asynccube {b}" for b in loops), "CuPy stream per thread",
                "torch blocking", "CuPy blocking", "numpy on the loop", "goal"]  # fmt: skip
    runs = max((len(v) for s in results.series.values() for v in s.values()), default=0)
    skipped = "; ".join(f"{k}: {v}" for k, v in results.skipped.items())
    body = "\n\n".join([
        "µs per request (wall time over all requests; median of "
        f"{runs} run{'s' if runs != 1 else ''}):",
        table(head, rows),
        "The loop thread's CPU per request (µs; the blocking peers: the calling thread's):",
        table(cpu_head, cpu_rows),
        "A request: `create(body)`, `empty`, `Bindings().with_buffers([x, y])"
        ".with_scalar(np.uint32, [n])`, `execute` of `y = 2x + 1` (float32), "
        "`await read([y])`; each task runs its share of the requests in a loop. "
        "Blocking peers run one request at a time (their figure in the 1-task row); the "
        "ratio compares each row with the best of them (with numpy on the loop where no GPU "
        "peer ran). Requests per figure: "
        + ", ".join(f"{size_label(s)} {n}" for s, n in plan.requests.items())
        + f"; trio at {', '.join(size_label(s) for s in plan.trio_sizes)} only."
        + (f"\n\nSkipped: {skipped}." if skipped else ""),
        f"Command: `python benchmarks/bench_requests.py {plan.command}`"
        " (`--quick`: a short run; `benchmarks/profile_requests.py`: where the time goes).",
    ])  # fmt: skip
    figures = {
        "device": plan.device,
        "tasks": plan.tasks,
        "requests": {str(k): v for k, v in plan.requests.items()},
        "series": {
            name: {f"{s}/{t}": [list(f) for f in figs] for (s, t), figs in by.items()}
            for name, by in results.series.items()
        },
        "skipped": results.skipped,
    }
    return body, figures


def default_device() -> str:
    """``cuda:0`` where asynccube can use a GPU, else ``host``."""
    try:
        from asynccube._core.cuda.driver import driver_available

        return "cuda:0" if driver_available()[0] else "host"
    except ImportError:
        return "host"


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "uvloop", "trio"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def publish(name: str, title: str, device: str, body: str, figures: Any, print_only: bool) -> None:
    """Write the section ``name`` of results (the environment and the peers' versions
    with it), or only print it (``--no-write``)."""
    if print_only:
        print(f"## {title}\n\n{body}")
        return
    env = environment(device)
    env.update(_versions())
    write(name, title, env, body, figures)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="", help="host or cuda:N (default: cuda:0 if usable)")
    ap.add_argument("--quick", action="store_true", help="one run, a quarter of the requests")
    ap.add_argument("--runs", type=int, default=None, help="runs (default 3; --quick: 1)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="body bytes")
    ap.add_argument("--tasks", default=",".join(map(str, TASKS)))
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--scale", type=float, default=1.0, help="requests per figure x this")
    ap.add_argument("--no-floor", action="store_true", help="skip the C floor")
    ap.add_argument("--no-write", action="store_true", help="print only (no results/ files)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Results:
    """Run the benchmark; print the tables; write ``results/requests[_host].{md,json}``."""
    args = parse(argv)
    device = args.device or default_device()
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    scale = args.scale * (0.25 if args.quick else 1.0)
    sizes = _ints(args.sizes)
    plan = Plan(
        device=device,
        works=[work_for(s) for s in sizes],
        tasks=_ints(args.tasks),
        requests={s: max(16, int(REQUESTS.get(s, 1024) * scale)) for s in sizes},
        loops=[b for b in args.loops.split(",") if b],
        command=" ".join(argv if argv is not None else sys.argv[1:]) or f"--device {device}",
    )
    if not any(s in TRIO_SIZES for s in sizes):
        plan.trio_sizes = (sizes[0],)
    results = Results()
    peers = _peers(plan, results)
    for r in range(runs):
        print(f"run {r + 1} of {runs} on {device}", file=sys.stderr, flush=True)
        one_run(plan, results, peers, floor=not args.no_floor)
    body, figures = report(plan, results)
    name = "requests" if device.startswith("cuda") else "requests_host"
    title = f"The request as users write it (issue 38), device {device}"
    publish(name, title, device, body, figures, args.no_write)
    return results


if __name__ == "__main__":
    main()
