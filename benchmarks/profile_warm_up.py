"""Where the first request after a warm-up still pays (issue 40, warm-up runs).

Run on a GPU: ``python benchmarks/profile_warm_up.py [--device cuda:0]``. Each variant
runs in a process of its own (so nothing one leaves warm helps the next) and prints the
phases of requests 1 to 5 and of the 100th (µs: ``create``, ``execute``, the read call,
its await; the request of ``tests/test_warm_up.py``'s ``handler``, 1 KiB):

- ``warm_up``: a fresh kernel, ``async with client.warm_up()`` around one request, then
  the requests (what a service does);
- ``warm_up+other``: the same, then one real request of *another* kernel before the
  measured ones (is the cost the kernel's own first launch, or any first request's?);
- ``eager``: ``warm_up`` with ``CUDA_MODULE_LOADING=EAGER`` (the driver loads every
  kernel of a module when it is loaded, not at its first launch);
- ``warm_up+spin``: ``warm_up``, then the loop's thread busy for 5 ms in plain Python
  (no asynccube call) right before the first measured request: a core that idled while
  the loop waited runs slowly for its first microseconds back (its clock and caches);
- ``warm_up+sleep``: ``warm_up``, then ``await asyncio.sleep(0.05)`` before the first
  measured request (the loop idle: threads the warm-up left busy, its compilers or the
  completion watcher, finish meanwhile);
- ``real_first``: no warm-up: one real request (it compiles), then the measured ones
  (what a second request costs without any scope).

After the 110 requests, each variant also times the same request five times after the
loop idled 50 ms (the median): what any request costs that arrives after a pause,
warm-up or not. ``PROFILE_WARM_UP_GC=0`` leaves out the ``gc.collect()`` before the
measured requests; ``PROFILE_WARM_UP_CPROFILE=1`` prints a cProfile of requests 1 and
100 instead.

Writes ``profiles/warm_up/<gpu>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = ("warm_up", "warm_up+spin", "warm_up+sleep", "warm_up+other", "eager", "real_first")


async def _phases(client: Any, kernel: Any, body: bytes) -> list[float]:
    import numpy as np

    import asynccube as ac

    t0 = time.perf_counter()
    x = client.create(body)
    t1 = time.perf_counter()
    bindings = ac.Bindings().with_buffer(x.binding()).with_scalar(np.uint32, [len(body) // 4])
    client.execute(kernel, ac.CubeCount(1), bindings)
    t2 = time.perf_counter()
    pending = client.read([x])
    t3 = time.perf_counter()
    (out,) = await pending
    t4 = time.perf_counter()
    assert bytes(out) == (2 * np.frombuffer(body, np.float32)).tobytes()
    return [(b - a) * 1e6 for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4))]


def _busy(seconds: float) -> None:
    """Keep this thread busy in plain Python for ``seconds``."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


async def _profiled(client: Any, kernel: Any, body: bytes) -> list[str]:
    """cProfile of request 1 and of request 100 (top 20 by own time each)."""
    import cProfile
    import io
    import pstats

    out = []
    for k in range(100):
        prof = cProfile.Profile() if k in (0, 99) else None
        if prof is not None:
            prof.enable()
        await _phases(client, kernel, body)
        if prof is not None:
            prof.disable()
            stats = pstats.Stats(prof, stream=io.StringIO()).stats  # type: ignore[attr-defined]
            top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:20]
            total = sum(v[2] for v in stats.values()) * 1e6
            calls = sum(v[1] for v in stats.values())
            rows = [f"request {k + 1}: {calls} calls, {total:.0f} µs (own time, profiled)"]
            for (path, line, fn), (_, nc, tt, ct, _) in top:
                where = f"{Path(path).name}:{line}({fn})" if line else fn
                rows.append(f"  {tt * 1e6:8.1f} µs own {ct * 1e6:8.1f} cum {nc:4d}x {where}")
            out.append("\n".join(rows))
    return out


async def variant(name: str, device: str) -> dict[str, Any]:
    import gc

    import numpy as np

    sys.path.insert(0, str(ROOT))
    from tests.test_warm_up import fresh_twice, handler

    import asynccube as ac

    body = np.arange(256, dtype=np.float32).tobytes()
    async with ac.open_client(device) as client:
        kernel = fresh_twice()
        if name == "real_first":
            await handler(client, kernel, body)
        else:
            async with client.warm_up():
                await handler(client, kernel, body)
            if name == "warm_up+other":
                await handler(client, fresh_twice(), body)  # compiles, then runs for real
        if name == "warm_up+spin":
            _busy(5e-3)
        if name == "warm_up+sleep":
            await asyncio.sleep(0.05)
        if os.environ.get("PROFILE_WARM_UP_GC", "1") == "1":
            gc.collect()
        gc.disable()
        try:
            if os.environ.get("PROFILE_WARM_UP_CPROFILE"):
                return {"profiles": await _profiled(client, kernel, body)}
            rows = [await _phases(client, kernel, body) for _ in range(110)]
            idle = []
            for _ in range(5):  # the same request after the loop idled 50 ms, warm otherwise
                await asyncio.sleep(0.05)
                idle.append(await _phases(client, kernel, body))
        finally:
            gc.enable()
    return {
        "first5": rows[:5],
        "hundredth": [statistics.median(r[k] for r in rows[95:105]) for k in range(4)],
        "idle": [statistics.median(r[k] for r in idle) for k in range(4)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(asyncio.run(variant(args.variant, args.device))))
        return
    lines = [
        "# The first requests after a warm-up, phase by phase (µs)",
        "",
        "Each variant in a process of its own; `python benchmarks/profile_warm_up.py`.",
        "",
        "| variant | request | create | execute | read call | await | total |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in VARIANTS:
        env = dict(os.environ)
        if name == "eager":
            env["CUDA_MODULE_LOADING"] = "EAGER"
        cmd = [sys.executable, __file__, "--device", args.device, "--variant", name]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            lines.append(f"| {name} | failed: {done.stderr.strip().splitlines()[-1:]} |")
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        if "profiles" in got:
            lines += [f"## {name}", "", "```", *got["profiles"], "```", ""]
            continue
        rows = [(str(k + 1), r) for k, r in enumerate(got["first5"])]
        rows.append(("100th (median 96-105)", got["hundredth"]))
        rows.append(("after 50 ms idle, request 111+ (median of 5)", got["idle"]))
        for label, r in rows:
            cells = " | ".join(f"{v:.1f}" for v in r)
            lines.append(f"| {name} | {label} | {cells} | {sum(r):.1f} |")
    text = "\n".join(lines)
    print(text)
    dest = HERE / "profiles" / "warm_up"
    dest.mkdir(parents=True, exist_ok=True)
    slug = args.device.replace(":", "")
    if args.device.startswith("cuda"):
        from cuda.bindings import driver as d

        d.cuInit(0)
        _, dev = d.cuDeviceGet(int(args.device.split(":")[1]))
        _, raw = d.cuDeviceGetName(64, dev)
        slug = raw.split(b"\0")[0].decode().replace("NVIDIA ", "").split()[0].lower()
    (dest / f"{slug}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
