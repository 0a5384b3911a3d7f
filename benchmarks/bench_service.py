"""A GPU web service under load: asynccube beside the ways users write it without.

Each server is an aiohttp app in its own process whose ``POST /y`` handler takes 256 KiB
of float32 ``x`` and answers ``y = 2x + 1`` (256 KiB), computed on the device:

* ``asynccube``: ``client.create`` + ``execute`` + ``await client.read`` on the loop;
* ``asynccube_lowlag``: the same with ``streaming.batch_us = 200`` (the client yields
  after 200 µs of commands instead of 1 ms);
* ``cupy_thread`` / ``torch_thread``: CuPy / PyTorch inside ``asyncio.to_thread``;
* ``cupy_blocking``: CuPy called blocking inside the handler;
* ``numpy_loop``: a floor, numpy on the loop and no device: what aiohttp, the two
  256 KiB bodies and the computation on the host cost the loop by themselves;
* ``echo``: the echo floor, the same server answering the body itself (no compute): the
  HTTP stack's own cost, the ceiling of any service.

A lag probe task in each server sleeps 1 ms in a loop and records how late it wakes (the
server loop's lag). Load comes from other processes (``--procs``, together ``--clients``
concurrent connections on loopback), each for a bounded time after a warm-up; every
response is checked against numpy. Reported per server loop (asyncio, uvloop): requests/s,
latency p50/p99, loop lag p99, and the ratios the issue asks for. With ``--runs N`` each
service runs N times (the services in turn, round after round); the run of median
requests/s is reported, with the spread of all N.

    python benchmarks/bench_service.py                    # host server (no GPU needed)
    python benchmarks/bench_service.py --device cuda:0    # on the GPU machine

Needs the ``bench`` extra (aiohttp; uvloop where available). Writes
``results/service.json`` and ``results/service.md``. A peer that cannot run here (no CuPy,
no GPU) is skipped with the reason.
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
from _common import environment, table, write
from _service_app import OURS, PEERS

HERE = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """This environment with the checkout's ``src`` first on PYTHONPATH."""
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_service_app.py"), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The server's first line of output (its port, or why it cannot serve)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    if line:
        return line
    if proc.poll() is not None:
        return f"SKIP server exited with {proc.returncode}"
    return f"SKIP server did not start in {timeout:g} s"


def _load_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        text = proc.communicate(timeout=timeout)[0]
        result: dict[str, Any] = json.loads(text)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        proc.kill()
        proc.wait()
        return {"latencies_us": [], "checked": 0, "mismatches": 0, "errors": 1,
                "first_error": f"load process failed: {exc!r}"[:200]}  # fmt: skip
    return result


def run_one(peer: str, loop: str, args: argparse.Namespace) -> dict[str, Any]:
    """One server process under load; its figures, or ``{"skipped": reason}``. The echo
    floor's answers are checked against the bodies sent."""
    extra = ["--gc-freeze"] if args.gc_freeze else []
    extra += ["--admit", str(args.admit)] if args.admit else []
    server = _spawn(["serve", peer, "--loop", loop, "--device", args.device, *extra])
    try:
        first = _first_line(server, 120)
        if not first.startswith("PORT "):
            return {"skipped": first.removeprefix("SKIP ")}
        url = f"http://127.0.0.1:{first.split()[1]}"
        outs, stats, _ = apply_load(url, args, echo=peer == "echo")
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    lat = sorted(x for o in outs for x in o["latencies_us"])
    bad = sum(o["mismatches"] for o in outs)
    errors = sum(o["errors"] for o in outs)
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
        "mismatches": bad,
        "errors": errors,
        "first_error": next((o["first_error"] for o in outs if o["first_error"]), ""),
        "server": stats.get("info", ""),
    }


def apply_load(
    url: str, args: argparse.Namespace, echo: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """``args.clients`` clients from ``args.procs`` load processes against ``url`` for
    ``args.seconds`` after ``args.warmup``: each process's result, the server's lag
    stats over that window, and the window's start (wall clock). ``echo``: the answers
    are checked against the bodies sent, not against ``2x + 1``."""
    load_loop = "uvloop" if _has_uvloop() else "asyncio"  # the lighter client
    start = time.time() + args.warmup + 1.0  # the load processes start meanwhile
    per = [args.clients // args.procs + (i < args.clients % args.procs)
           for i in range(args.procs)]  # fmt: skip
    loads = [
        _spawn(["load", url, "--clients", str(k), "--start", str(start),
                "--seconds", str(args.seconds), "--loop", load_loop,
                *(["--echo"] if echo else [])])
        for k in per
    ]  # fmt: skip
    outs = [_load_result(p, args.seconds + args.warmup + 120) for p in loads]
    stats = _get_json(f"{url}/stats?since={start}&until={start + args.seconds}")
    return outs, stats, start


def load_instrumented(
    cmd: list[str], args: argparse.Namespace
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
        outs, stats, start = apply_load(f"http://127.0.0.1:{first[1]}", args)
        server.stdin.write(f"{start} {start + args.seconds}\n")
        server.stdin.flush()
        figures: dict[str, Any] = json.loads(server.stdout.readline())
    finally:
        server.terminate()
        server.wait(10)
    return outs, stats, figures


def _get_json(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _verdicts(by_loop: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per server loop and asynccube service: its ratios, lag and the floor's."""
    rows = []
    for loop, peers in by_loop.items():
        nonblocking = [
            peers[p]["requests_per_s"]
            for p in ("cupy_thread", "torch_thread")
            if "requests_per_s" in peers.get(p, {})
        ]
        best = max(nonblocking) if nonblocking else None
        blocking = peers.get("cupy_blocking", {}).get("requests_per_s")
        floor = peers.get("numpy_loop", {})
        floor_text = (
            f"{floor['loop_lag_p99_ms']:.2f} ms at {floor['requests_per_s']:.0f}/s"
            if "requests_per_s" in floor
            else "-"
        )
        echo = peers.get("echo", {}).get("requests_per_s")
        for peer, batch_us in OURS.items():
            if peer not in peers:
                continue
            ours = peers[peer]
            rps, lag = ours.get("requests_per_s"), ours.get("loop_lag_p99_ms")
            rows.append([f"{loop}, {peer} (batch_us {batch_us})", _ratio(rps, best),
                         _ratio(rps, blocking), "-" if lag is None else f"{lag:.2f}",
                         floor_text, _ratio(rps, floor.get("requests_per_s")),
                         _ratio(rps, echo), _met(rps, lag, best, blocking)])  # fmt: skip
    return rows


def _met(rps: float | None, lag: float | None, best: float | None, blocking: float | None) -> str:
    if rps is None:
        return "n/a"
    goal = (
        (best is None or rps >= 1.5 * best)
        and (blocking is None or rps >= blocking)
        and lag is not None
        and lag <= 2.0
    )
    if not goal:
        return "missed"
    return "met" if best is not None and blocking is not None else "met (peers skipped)"


def render(by_loop: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    rows = []
    for loop, peers in by_loop.items():
        for peer, r in peers.items():
            if "skipped" in r:
                rows.append([loop, peer, "skipped", "-", "-", "-", "-", r["skipped"][:90]])
                continue
            ok = f"{r['checked']} checked, {r['mismatches']} wrong, {r['errors']} errors"
            rows.append([loop, peer, _rps_text(r),
                         f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-",
                         f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-",
                         f"{r['loop_lag_p99_ms']:.2f}", _gc_text(r), ok])  # fmt: skip
    body = table(["loop", "service", "requests/s", "p50 ms", "p99 ms", "loop lag p99 ms",
                  "GC ms/s, longest, full", "responses vs numpy"], rows)  # fmt: skip
    goals = table(["server loop, service", "vs best non-blocking peer (goal >= 1.5x)",
                   "vs blocking CuPy handler (goal >= 1.0x)", "loop lag p99 ms (goal <= 2)",
                   "floor: numpy on the loop, no device", "vs numpy floor", "vs echo floor",
                   "goal"],
                  _verdicts(by_loop))  # fmt: skip
    return f"{body}\n\n{goals}\n\n{_how(args)}"


def _how(args: argparse.Namespace) -> str:
    """The paragraph under the tables: the load, the floor, the options, the command."""
    frozen = ", with every server's start-up objects frozen (`gc.freeze()`)"
    bound = f"Every server lets at most {args.admit} requests into its handler at once (the "
    options = (frozen if args.gc_freeze else "") + ". "
    options += bound + "others wait, their bodies unread). " if args.admit else ""
    flags = (" --gc-freeze" if args.gc_freeze else "") + (
        f" --admit {args.admit}" if args.admit else ""
    )
    flags += f" --runs {args.runs}" if args.runs > 1 else ""
    runs = (
        f", {args.runs} runs (requests/s: the median run's, the lowest and highest)"
        if args.runs > 1
        else ""
    )
    return (
        f"Each request: 256 KiB float32 in, `y = 2x + 1`, 256 KiB out; "
        f"{args.clients} concurrent clients from {args.procs} load processes on loopback, "
        f"{args.warmup:g} s warm-up then {args.seconds:g} s measured per service{runs}. The "
        "floor `numpy_loop` computes on the loop with no device: its loop lag is what "
        "aiohttp and the bodies alone cost at this load; the echo floor (`echo`) answers the "
        "body itself, the HTTP stack's own cost. GC: the garbage collector's pauses in the "
        f"window (they stop the loop too){options}Command: "
        f"`python benchmarks/bench_service.py --device {args.device}{flags}` "
        "(on the GPU: inside `benchmarks/bench_gpu.sh`)."
    )


def _rps_text(r: dict[str, Any]) -> str:
    """Requests/s, with the spread of the runs where there are several."""
    runs = r.get("runs_requests_per_s", [])
    spread = f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else ""
    return f"{r['requests_per_s']:.0f}{spread}"


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median requests/s, with every run's requests/s and the responses of all
    runs counted; or the first skip."""
    done = sorted((r for r in runs if "skipped" not in r), key=lambda r: r["requests_per_s"])
    if not done:
        return runs[0]
    merged = {**done[(len(done) - 1) // 2]}
    merged["runs_requests_per_s"] = [r["requests_per_s"] for r in runs if "skipped" not in r]
    for key in ("checked", "mismatches", "errors"):
        merged[key] = sum(r[key] for r in done)
    merged["first_error"] = next((r["first_error"] for r in done if r["first_error"]), "")
    return merged


def _gc_text(r: dict[str, Any]) -> str:
    if "gc_ms_per_s" not in r:
        return "-"
    return f"{r['gc_ms_per_s']:.1f}, {r['gc_max_ms']:.1f} ms, {r['gc_full']}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="host")
    p.add_argument("--loops", default="asyncio,uvloop")
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--procs", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 4)))
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--runs", type=int, default=1,
                   help="runs per service, round after round: median and spread")  # fmt: skip
    p.add_argument("--admit", type=int, default=0,
                   help="every server lets at most N requests into its handler")  # fmt: skip
    p.add_argument("--gc-freeze", action="store_true",
                   help="every server calls gc.freeze() once it is ready")  # fmt: skip
    p.add_argument("--name", default="", help="results name (default: service, service_host)")
    p.add_argument("--json-only", action="store_true", help="print the figures, write nothing")
    args = p.parse_args()
    if args.admit < 0:
        p.error(f"--admit must be >= 0 (0: no bound), got {args.admit}")
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    by_loop: dict[str, dict[str, Any]] = {}
    for loop in args.loops.split(","):
        if loop == "uvloop" and not _has_uvloop():
            by_loop[loop] = {peer: {"skipped": "uvloop is not installed"} for peer in PEERS}
            continue
        runs: dict[str, list[dict[str, Any]]] = {peer: [] for peer in args.peers.split(",")}
        for _ in range(args.runs):  # round after round: a drift spreads over every service
            for peer, done in runs.items():
                if done and "skipped" in done[0]:
                    continue
                r = run_one(peer, loop, args)
                done.append(r)
                print(f"{loop:8} {peer:14} {json.dumps(r)}", flush=True)
        by_loop[loop] = {peer: _median_run(done) for peer, done in runs.items()}
    if args.json_only:
        print(json.dumps(by_loop))
        return 0
    device = args.device if args.device != "host" else ""
    name = args.name or ("service" if device else "service_host")
    if args.admit and not args.name:
        name += f"_admit{args.admit}"
    env = environment(device)
    bound = f", at most {args.admit} requests in each handler" if args.admit else ""
    write(name, f"GPU service under load (issue 11), device {args.device}{bound}", env,
          render(by_loop, args), {"results": by_loop, "args": vars(args)})  # fmt: skip
    wrong = sum(r.get("mismatches", 0) + r.get("errors", 0) for v in by_loop.values()
                for r in v.values())  # fmt: skip
    return 1 if wrong else 0


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
