"""A GPU web service under load: asynccube beside the ways users write it without.

Each server is an aiohttp app in its own process whose ``POST /y`` handler answers one of
two workloads (``--workload small|compute``, default both; ``_service_work.py``):

* ``small``: 256 KiB of float32 ``x`` in, ``y = 2x + 1``, 256 KiB out;
* ``compute``: 64 KiB in, a one-block kernel of ~1 ms (``--iters`` FMAs per element;
  on a GPU calibrated to ``--kernel-ms`` unless given; the host server runs the same
  math in numpy with 16 iterations), 64 KiB out.

The services: ``asynccube`` (``client.create`` + ``execute`` + ``await client.read`` on
the loop; ``asynccube_lowlag``: the same with ``streaming.batch_us = 200``);
``cupy_thread`` / ``torch_thread`` (CuPy / PyTorch inside ``asyncio.to_thread``),
``cupy_streams`` (CuPy inside ``asyncio.to_thread``, each worker thread on its own
non-blocking stream), ``cupy_blocking`` (CuPy called blocking in the handler); the CuPy
peers of ``compute`` run the same CUDA source through ``cupy.RawKernel``. Two floors:
``numpy_loop`` (numpy on the loop, no device) and ``echo`` (the body sent back, no
compute: the HTTP stack's own cost, the ceiling of any service). With ``--no-http`` (by
default for ``compute``), ``asynccube``, ``cupy_blocking`` and ``cupy_streams`` also run
as 64 tasks in one loop calling the handler directly, no HTTP.

A lag probe task in each server sleeps 1 ms in a loop and records how late it wakes (the
server loop's lag). Load comes from other processes (``--procs``, default 4, together
``--clients`` concurrent connections on loopback), each for a bounded time after a
warm-up; every response is checked. Reported per workload and server loop (asyncio,
uvloop): requests/s, latency p50/p99, loop lag p99, and each goal of issue 30 met or
missed. With ``--runs N`` each service runs N times (the services in turn, round after
round); the run of median requests/s is reported, with the spread of all N.

    python benchmarks/bench_service.py --device host      # host server (no GPU needed)
    python benchmarks/bench_service.py --device cuda:0    # on the GPU machine (~8 min)

Needs the ``bench`` extra (aiohttp; uvloop where available). Writes
``results/service.{json,md}`` (small) and ``results/service_compute.{json,md}`` (compute,
with the no-HTTP table); ``_host`` names on the host server. A peer that cannot run here
(no CuPy, no GPU) is skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, write
from _service_report import median_run, render_direct, render_http
from _service_work import GPU_ITERS, HOST_ITERS

HERE = Path(__file__).resolve().parent
DEFAULT_PEERS = {
    "small": "asynccube,cupy_thread,cupy_streams,torch_thread,cupy_blocking,numpy_loop,echo",
    "compute": "asynccube,cupy_streams,cupy_blocking,echo",
}
NO_HTTP_PEERS = "asynccube,cupy_blocking,cupy_streams"
START_S = {"torch_thread": 4.5}
"""Seconds a run spends outside its warm-up and window (start, load start, stop): 2."""


def child_env() -> dict[str, str]:
    """This environment with the checkout's ``src`` first on PYTHONPATH."""
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _spawn(args: list[str], stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_service_app.py"), *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The process's first line of output (a port, READY, or why it cannot serve)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    if line:
        return line
    if proc.poll() is not None:
        return f"SKIP process exited with {proc.returncode}"
    return f"SKIP process did not start in {timeout:g} s"


def _failed(why: str) -> dict[str, Any]:
    return {"latencies_us": [], "checked": 0, "mismatches": 0, "errors": 1,
            "first_error": why[:200]}  # fmt: skip


def _load_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        text = proc.communicate(timeout=timeout)[0]
        result: dict[str, Any] = json.loads(text)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        proc.kill()
        proc.wait()
        return _failed(f"load process failed: {exc!r}")
    return result


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def work_args(work: str, args: argparse.Namespace) -> list[str]:
    """The options that select ``work`` in a child process."""
    return ["--workload", work, "--iters", str(args.iters)]


def run_one(peer: str, loop: str, work: str, args: argparse.Namespace) -> dict[str, Any]:
    """One server process under load; its figures, or ``{"skipped": reason}``. The echo
    floor's answers are checked against the bodies sent."""
    extra = ["--gc-freeze"] if args.gc_freeze else []
    extra += ["--admit", str(args.admit)] if args.admit else []
    server = _spawn(["serve", peer, "--loop", loop, "--device", args.device,
                     *work_args(work, args), *extra])  # fmt: skip
    try:
        first = _first_line(server, 120)
        if not first.startswith("PORT "):
            return {"skipped": first.removeprefix("SKIP ")}
        url = f"http://127.0.0.1:{first.split()[1]}"
        outs, stats, _ = apply_load(url, args, echo=peer == "echo", work=work)
    finally:
        _stop(server)
    lat = sorted(x for o in outs for x in o["latencies_us"])
    return {
        "requests_per_s": len(lat) / args.seconds,
        "p50_ms": lat[len(lat) // 2] / 1e3 if lat else None,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1e3 if lat else None,
        "loop_lag_p99_ms": stats["lag_p99_ms"],
        "loop_lag_max_ms": stats["lag_max_ms"],
        "gc_ms_per_s": stats["gc_ms_per_s"],
        "gc_max_ms": stats["gc_max_ms"],
        "gc_full": stats["gc_full"],
        "handler_max": stats["handler_max"],
        "checked": sum(o["checked"] for o in outs),
        "mismatches": sum(o["mismatches"] for o in outs),
        "errors": sum(o["errors"] for o in outs),
        "first_error": next((o["first_error"] for o in outs if o["first_error"]), ""),
        "server": stats.get("info", ""),
    }


def run_direct(loop: str, work: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each no-HTTP peer's handler called by ``args.clients`` tasks in one loop
    (``_service_app direct``): one process per peer, ``args.runs`` windows one after the
    other (no HTTP connections to set up again); the median window of each."""
    by_peer: dict[str, Any] = {}
    for peer in NO_HTTP_PEERS.split(","):
        if loop == "uvloop" and not _has_uvloop():
            by_peer[peer] = {"skipped": "uvloop is not installed"}
            continue
        proc = _spawn(["direct", peer, "--loop", loop, "--device", args.device,
                       *work_args(work, args), "--tasks", str(args.clients), "--warmup",
                       str(args.warmup), "--seconds", str(args.seconds), "--runs",
                       str(args.runs)])  # fmt: skip
        runs: Any = _load_result(proc, args.warmup + args.runs * args.seconds + 180)
        if not isinstance(runs, list):  # it crashed: say so, and count it as an error
            runs = [{"skipped": f"the process failed: {runs.get('first_error')}", "errors": 1}]
        for r in runs:
            print(f"{work:7} {loop:8} {peer + ' no HTTP':22} {json.dumps(r)[:400]}", flush=True)
        by_peer[peer] = median_run(runs)
    return by_peer


def apply_load(
    url: str, args: argparse.Namespace, echo: bool = False, work: str = "small"
) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """``args.clients`` clients from ``args.procs`` load processes against ``url`` for
    ``args.seconds`` after ``args.warmup``: each process's result, the server's lag
    stats over that window, and the window's start (wall clock). ``echo``: the answers
    are checked against the bodies sent."""
    load_loop = "uvloop" if _has_uvloop() else "asyncio"  # the lighter client
    per = [args.clients // args.procs + (i < args.clients % args.procs)
           for i in range(args.procs)]  # fmt: skip
    iters = getattr(args, "iters", 0)
    loads = [
        _spawn(["load", url, "--clients", str(k), "--seconds", str(args.seconds),
                "--loop", load_loop, "--workload", work, "--iters", str(iters),
                *(["--echo"] if echo else [])], stdin=True)
        for k in per
    ]  # fmt: skip
    ready = [_first_line(p, 60) for p in loads]  # each has made its bodies
    start = time.time() + 0.3 + args.warmup
    for p in loads:
        assert p.stdin is not None
        p.stdin.write(f"{start}\n")
        p.stdin.flush()  # communicate() closes it
    outs = [
        _load_result(p, args.seconds + args.warmup + 120)
        if line == "READY"
        else _failed(f"load process: {line}") | {"killed": _kill(p)}
        for p, line in zip(loads, ready, strict=True)
    ]
    stats = _get_json(f"{url}/stats?since={start}&until={start + args.seconds}")
    return outs, stats, start


def _kill(proc: subprocess.Popen[str]) -> bool:
    proc.kill()
    proc.wait()
    return True


def load_instrumented(
    cmd: list[str], args: argparse.Namespace, work: str = "small", echo: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]] | str:
    """Start ``cmd``, a server that prints ``PORT n`` and then answers a window on stdin
    with its own figures (``_service_app.answer_windows``), load it (:func:`apply_load`)
    and ask for the load's window: each load process's result, the lag stats and the
    server's figures; or why the server did not start."""
    server = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env()
    )
    assert server.stdin is not None
    assert server.stdout is not None
    try:
        first = server.stdout.readline().split()
        if first[:1] != ["PORT"]:
            return f"the server did not start ({' '.join(first)})"
        outs, stats, start = apply_load(f"http://127.0.0.1:{first[1]}", args, echo, work)
        server.stdin.write(f"{start} {start + args.seconds}\n")
        server.stdin.flush()
        figures: dict[str, Any] = json.loads(server.stdout.readline())
    finally:
        _stop(server)
    return outs, stats, figures


def _get_json(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """Set ``args.iters`` (the compute kernel's iterations) and say how it was chosen."""
    if args.iters:
        return {"iters": args.iters, "how": "given (--iters)"}
    if args.device == "host":
        args.iters = HOST_ITERS
        return {"iters": args.iters, "how": "the host server's default (numpy)"}
    proc = _spawn(["calibrate", "--device", args.device, "--iters", str(GPU_ITERS // 4),
                   "--kernel-ms", str(args.kernel_ms)])  # fmt: skip
    done = _load_result(proc, 180)
    if "iters" not in done:
        args.iters = GPU_ITERS
        return {"iters": args.iters, "how": f"default (calibration failed: {done})"}
    args.iters = int(done["iters"])
    how = f"calibrated: {done['kernel_ms']:.3f} ms per kernel (alone, back to back)"
    return {**done, "how": how}


def rounds(
    run: Any, peers: list[str], loops: list[str], work: str, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """``run(peer, loop, work, args)`` for each loop, ``args.runs`` rounds of every peer;
    the median run of each (:func:`median_run`)."""
    by_loop: dict[str, dict[str, Any]] = {}
    for loop in loops:
        if loop == "uvloop" and not _has_uvloop():
            by_loop[loop] = {peer: {"skipped": "uvloop is not installed"} for peer in peers}
            continue
        runs: dict[str, list[dict[str, Any]]] = {peer: [] for peer in peers}
        for _ in range(args.runs):  # round after round: a drift spreads over every service
            for peer, done in runs.items():
                if done and "skipped" in done[0]:
                    continue
                r = run(peer, loop, work, args)
                done.append(r)
                print(f"{work:7} {loop:8} {peer:14} {json.dumps(r)[:400]}", flush=True)
        by_loop[loop] = {peer: median_run(done) for peer, done in runs.items()}
    return by_loop


def _plan(args: argparse.Namespace) -> list[tuple[str, list[str], list[str]]]:
    """(workload, peers over HTTP, peers with no HTTP) for each workload to run."""
    works = ["small", "compute"] if args.workload == "both" else [args.workload]
    no_http = {"none": [], "all": works}.get(args.no_http, args.no_http.split(","))
    return [(w, (args.peers or DEFAULT_PEERS[w]).split(","),
             NO_HTTP_PEERS.split(",") if w in no_http else [])
            for w in works]  # fmt: skip


def expected_seconds(args: argparse.Namespace) -> float:
    """About how long the run takes: every run's warm-up, window and start-up."""
    loops = len(args.loops.split(","))
    total = 5.0 if args.device != "host" else 0.0  # the calibration
    for _, http, direct in _plan(args):
        for peer in http:
            total += args.runs * loops * (args.warmup + args.seconds + START_S.get(peer, 2.0))
        total += len(direct) * loops * (2.0 + args.warmup + args.runs * args.seconds)
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="host")
    p.add_argument("--workload", default="both", choices=("both", "small", "compute"))
    p.add_argument("--loops", default="asyncio,uvloop")
    p.add_argument("--peers", default="", help="services over HTTP (default: per workload)")
    p.add_argument("--no-http", default="compute",
                   help="workloads also run with no HTTP: compute, small, all or none")  # fmt: skip
    p.add_argument("--iters", type=int, default=0,
                   help="compute kernel's iterations (default: calibrated on a GPU, "
                   f"{HOST_ITERS} on the host)")  # fmt: skip
    p.add_argument("--kernel-ms", type=float, default=1.0, help="the calibration's target")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3,
                   help="runs per service, round after round: median and spread")  # fmt: skip
    p.add_argument("--admit", type=int, default=0,
                   help="every server lets at most N requests into its handler")  # fmt: skip
    p.add_argument("--gc-freeze", action="store_true",
                   help="every server calls gc.freeze() once it is ready")  # fmt: skip
    p.add_argument("--name", default="", help="results name prefix (default: service)")
    p.add_argument("--json-only", action="store_true", help="print the figures, write nothing")
    args = p.parse_args()
    if args.admit < 0:
        p.error(f"--admit must be >= 0 (0: no bound), got {args.admit}")
    if args.runs < 1 or args.procs < 1 or args.clients < args.procs:
        p.error("--runs and --procs must be >= 1 and --clients >= --procs")
    t0 = time.perf_counter()
    print(f"expected wall time: about {expected_seconds(args) / 60:.1f} min", flush=True)
    kernel = calibrate(args) if any(w == "compute" for w, _, _ in _plan(args)) else {}
    loops, figures = args.loops.split(","), {}
    for work, http, direct in _plan(args):
        figures[work] = {"http": rounds(run_one, http, loops, work, args)}
        if direct:
            figures[work]["no_http"] = {loop: run_direct(loop, work, args) for loop in loops}
    print(f"wall time: {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    if args.json_only:
        print(json.dumps({**figures, "kernel": kernel}))
        return _wrong(figures)
    for work, f in figures.items():
        _write(work, f, kernel if work == "compute" else {}, args)
    return _wrong(figures)


def _write(work: str, f: dict[str, Any], kernel: dict[str, Any], args: argparse.Namespace) -> None:
    device = args.device if args.device != "host" else ""
    name = (args.name or "service") + ("_compute" if work == "compute" else "")
    name += "" if device else "_host"
    if args.admit and not args.name:
        name += f"_admit{args.admit}"
    body = render_http(work, f["http"], args, kernel)
    if "no_http" in f:
        body += "\n\n" + render_direct(work, f["no_http"], args)
    bound = f", at most {args.admit} requests in each handler" if args.admit else ""
    title = {"small": "small bodies (256 KiB)", "compute": "compute-bound (~1 ms kernel)"}[work]
    figures = {"results": f, "kernel": kernel, "args": vars(args)}
    title = f"GPU service under load, {title} (issue 30), device {args.device}{bound}"
    write(name, title, environment(device), body, figures)


def _wrong(figures: dict[str, Any]) -> int:
    every = (r for f in figures.values() for by_loop in f.values() for v in by_loop.values()
             for r in v.values())  # fmt: skip
    wrong = sum(r.get("mismatches", 0) + r.get("errors", 0) for r in every)
    return 1 if wrong else 0


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
