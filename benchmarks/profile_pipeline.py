"""Where the one-host pipeline's time goes (diagnostic): ``examples/ray_pipeline.py``'s
two stages on one device with handles between them, under cProfile, the top functions
by own and by cumulative time (written to ``$OUT/profile-pipeline.txt`` when ``$OUT``
is set), and each step of one item timed alone (create, the two kernels, to_client,
read_array).

    python benchmarks/profile_pipeline.py [--device cuda:0] [--items 256] [--size 1048576]
    python benchmarks/profile_pipeline.py --devices cuda:0,cuda:1 --staged   # a stage a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
import ray_pipeline as rp  # noqa: E402


async def steps(devices: list[str], x: np.ndarray, rounds: int = 20) -> dict[str, float]:
    """Milliseconds of each step of one item, alone (each awaited to completion)."""
    a, b = rp.Stage(devices[0], 2.0, 1.0), rp.Stage(devices[1], 0.5, -1.0)
    await a.start()
    await b.start()
    assert a.client is not None
    assert b.client is not None
    out: dict[str, list[float]] = {"create": [], "execute": [], "to_client": [], "read_array": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        h = a.client.create(x)
        await a.client.sync()
        t1 = time.perf_counter()
        a._run(h, x.size)
        await a.client.sync()
        t2 = time.perf_counter()
        h2 = a.client.to_client(h, b.client)
        await b.client.sync()
        t3 = time.perf_counter()
        await b.client.read_array(h2, np.float32)
        t4 = time.perf_counter()
        for key, seconds in zip(out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            out[key].append(seconds * 1e3)
    await a.close()
    await b.close()
    return {k: sorted(v)[len(v) // 2] for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--devices", help="two devices, comma-separated: a stage on each")
    p.add_argument("--items", type=int, default=256)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--staged", action="store_true", help="items in and out of staging buffers")
    args = p.parse_args()
    items = rp.make_items(args.items, args.size)
    devices = args.devices.split(",") if args.devices else [args.device] * 2
    print("steps (ms, median of 20):", asyncio.run(steps(devices, items[0])))
    prof = cProfile.Profile()
    prof.enable()
    out, rate = asyncio.run(rp.local_pipeline(devices, items, handles=True, staged=args.staged))
    prof.disable()
    rp.check(items, out)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
    print(f"{rate:.0f} items/s under cProfile\n{text.getvalue()}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "profile-pipeline.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
