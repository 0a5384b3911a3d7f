"""Channel overhead on the host server (issue 2).

* µs per ``execute`` of a no-op host kernel through the client (queued, then drained by
  the actor, amortized over a batch and an awaited ``sync``) versus calling the server
  directly (``HostServer.execute`` in a loop, then ``sync``), with 0 and 4 buffer bindings;
* commands per second through the channel.

Run: ``python benchmarks/bench_channel.py`` (``--quick`` for a short run).
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np

import asynccube as ac
from asynccube._core.host.server import HostServer

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from _common import best_of, clock, environment, table, write

NOOP = ac.Kernel("bench_noop", host=lambda launch: None)
COUNT = ac.CubeCount(1)
MODE = ac.ExecutionMode.CHECKED


def _direct(n: int, buffers: int) -> float:
    server = HostServer(max_streams=2)
    stream = ac.StreamId(1)
    handles = [server.new_handle(256, stream) for _ in range(buffers)]
    server.create(handles, stream)
    bindings = ac.Bindings().with_buffers([h.binding() for h in handles])
    start = clock()
    for _ in range(n):
        server.execute(NOOP, COUNT, bindings, MODE, stream)
        if not _ & 1023:
            server.end_batch()
    done = server.sync(stream)
    server.end_batch()
    done.wait(None)
    elapsed = clock() - start
    server.close().wait(None)
    return elapsed / n * 1e6


async def _through_client(client: ac.ComputeClient, n: int, buffers: int) -> float:
    handles = [client.empty(256) for _ in range(buffers)]
    bindings = ac.Bindings().with_buffers([h.binding() for h in handles])
    await client.sync()
    start = clock()
    for _ in range(n):
        client.execute(NOOP, COUNT, bindings)
    await client.sync()
    return (clock() - start) / n * 1e6


async def _client_side_only(client: ac.ComputeClient, n: int) -> float:
    bindings = ac.Bindings()
    await client.sync()
    start = clock()
    for _ in range(n):
        client.execute(NOOP, COUNT, bindings)
    elapsed = clock() - start
    await client.sync()
    return elapsed / n * 1e6


async def _mixed_commands_per_second(client: ac.ComputeClient, n: int) -> float:
    data = np.zeros(64, np.uint8).tobytes()
    h = client.create(data)
    desc = h.copy_descriptor((64,), (1,), 1)
    await client.sync()
    start = clock()
    for i in range(n // 4):
        client.execute(NOOP, COUNT, ac.Bindings().with_buffer(h.binding()))
        client.write([(desc, data)])
        client.flush()
        if i % 64 == 0:
            await client.read([h])
        else:
            client.execute(NOOP, COUNT, ac.Bindings())
    await client.sync()
    return n / (clock() - start)


async def _client_figures(n: int, rounds: int) -> dict[str, float]:
    async with ac.open_client("host") as client:
        out: dict[str, float] = {}
        for buffers in (0, 4):
            vals = [await _through_client(client, n, buffers) for _ in range(rounds)]
            out[f"client_{buffers}"] = min(vals)
        out["enqueue_only"] = min([await _client_side_only(client, n) for _ in range(rounds)])
        out["mixed_cps"] = max([await _mixed_commands_per_second(client, n) for _ in range(rounds)])
        return out


def main() -> None:
    quick = "--quick" in sys.argv
    n, rounds = (2000, 3) if quick else (20000, 7)
    direct = {b: best_of(lambda b=b: _direct(n, b), rounds) for b in (0, 4)}
    figures = asyncio.run(_client_figures(n, rounds))
    rows = []
    for b in (0, 4):
        via = figures[f"client_{b}"]
        rows.append(
            [
                f"execute, no-op host kernel, {b} buffers (µs, amortized)",
                f"{via:.2f}",
                f"{direct[b]:.2f}",
                f"{via / direct[b]:.2f}x",
            ]
        )
    rows.append(
        [
            "client.execute call alone (µs; runs inline when the actor is idle)",
            f"{figures['enqueue_only']:.2f}",
            "-",
            "-",
        ]
    )
    body = table(["figure", "through the client", "server directly", "ratio"], rows)
    body += (
        f"\n\nCommands per second through the channel (a mix of execute, write, flush and "
        f"one awaited read in 64 rounds): **{figures['mixed_cps']:,.0f}/s**; no-op executes "
        f"alone: **{1e6 / figures['client_0']:,.0f}/s**.\n\n"
        f"Best of {rounds} rounds of {n} commands. Command: `python benchmarks/bench_channel.py`."
    )
    env = environment()
    write(
        "channel",
        "Channel overhead on the host server (issue 2)",
        env,
        body,
        {"direct_us": direct, **figures, "n": n, "rounds": rounds},
    )


if __name__ == "__main__":
    main()
