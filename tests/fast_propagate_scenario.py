"""Scenarios of failures that propagate (issue 40) on the CUDA server's client path, with
the no-op driver of ``benchmarks/bench_overhead.py``: while a buffer carries a failure
the one-call launch route declines every launch, and the Python route skips a launch
binding a carrier (before compiling its kernel) and gives its buffers the failure.

Run in its own process by ``tests/test_fast_launch.py`` (as ``fast_launch_scenario.py``,
whose setup it shares); ``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python
twin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np

import asynccube as ac
from fast_launch_scenario import ADD, N, Setup, bench_overhead, main


class Steps:
    """The scenarios' steps (not scenarios: the test runs each top-level ``async def``)."""

    @staticmethod
    async def failed(s: Setup) -> None:
        """Launch the add kernel with a scalar too wide for its signature: the server
        refuses it when it is issued, so its three buffers carry an InvalidArgument."""
        wide = ac.Bindings().with_buffers([h.binding() for h in s.handles])
        s.client.execute(ADD, s.count, wide.with_scalar(np.uint64, [N]))
        try:
            await s.client.sync()
        except ac.InvalidArgument:
            return
        raise AssertionError("the failing launch was not raised")

    @staticmethod
    async def carried(s: Setup, h: ac.Handle) -> str:
        """The message of the error a read of ``h`` raises: the root's type, and tainted."""
        try:
            await s.client.read([h])
        except ac.InvalidArgument as exc:
            if not isinstance(exc, ac.TaintedBuffer):
                raise
            return str(exc)
        raise AssertionError(f"a read of {h!r} did not raise the root's error")


async def propagate_skipped() -> None:
    """A launch binding a carrier is declined by the route and skipped by the Python
    route (not issued: the stream's cursor stays); its output carries the failure with
    the skip named; once every buffer is written again the route takes launches again."""
    s = await Setup().ready()
    await Steps.failed(s)
    out = s.client.empty(4 * N)
    hits, declined = s.stats
    stamp = s.stamp()
    s.client.execute(ADD, s.count, s.writing_to(out))
    assert s.stats[0] == hits and s.stats[1] > declined, s.stats  # declined: taints held
    assert s.stamp() == stamp  # nothing issued
    await s.client.sync()  # a skip is no new error
    needed = s.handles[0].binding().memory.id
    text = await Steps.carried(s, out)
    assert f"skipped `fl_add`: it needed memory {needed}, which carried the failure" in text
    s.rewrite()
    s.client.write([(out.copy_descriptor((N,), (1,), 4), bytes(4 * N))])
    await s.client.sync()
    assert not s.client._channel._held._tainted
    hits, _ = s.stats
    s.client.execute(ADD, s.count, s.writing_to(out))
    assert s.stats[0] == hits + 1, s.stats  # taken again
    await s.client.sync()
    await s.client.close()


async def propagate_before_compile() -> None:
    """A kernel not loaded yet, launched on a carrier, is skipped before it is compiled
    (the actor's prepare step never runs); its output carries the failure."""
    s = await Setup().ready()
    await Steps.failed(s)
    fresh = ac.Kernel("fl_add_unloaded", cuda=ac.CudaSource(bench_overhead.ADD, "add", (256, 1, 1)))
    out = s.client.empty(4 * N)
    s.client.execute(fresh, s.count, s.writing_to(out))
    await s.client.sync()
    assert "fl_add_unloaded" not in s.server.loaded_kernels
    assert "skipped `fl_add_unloaded`" in await Steps.carried(s, out)
    assert s.client._channel._held.failures() == 1
    del out
    s.rewrite()
    await s.client.sync()
    await s.client.memory_usage()  # the dropped handle is taken back here
    assert s.client._channel._held.failures() == 0  # freed with its last carrier
    await s.client.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f for f in (propagate_skipped, propagate_before_compile)
}

if __name__ == "__main__":
    main(SCENARIOS)
