"""Tunables of known, clearly different cost for the autotune tests (also imported by the
subprocess in test_tune_tuner.py, so keep it importable on its own)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import asynccube as ac

SAMPLES = 3
"""Profiled samples per tunable in the tests (warm-up: 1)."""


def _sleep_host(launch: ac.HostLaunch) -> None:
    time.sleep(float(launch.scalar(np.float32)))


SLEEP = ac.Kernel("test_tune_sleep", host=_sleep_host)
"""Sleeps (on the stream's worker thread, releasing the GIL) for its float32 scalar."""


def _fail_host(launch: ac.HostLaunch) -> None:
    raise RuntimeError("kernel exploded on the worker")


FAIL = ac.Kernel("test_tune_fail", host=_fail_host)
"""Raises inside the host worker: the error is held and raised at the next await."""


class SizeKey(ac.AutotuneKey):
    """Keyed by the anchored size."""

    n: int


def size_key(n: int) -> SizeKey:
    """The key of an int input."""
    return SizeKey(ac.anchor(n))


Fn = Callable[[ac.ComputeClient, int], Awaitable[str]]


def sleeper(ms: float, calls: Counter[str], name: str | None = None) -> ac.Tunable[int, str]:
    """A tunable queuing a host kernel that sleeps ``ms``; counts its calls; returns its
    name."""
    label = name or f"sleep_{ms:g}ms"

    async def fn(client: ac.ComputeClient, n: int) -> str:
        calls[label] += 1
        h = client.empty(4)
        bindings = ac.Bindings().with_buffers([h.binding()]).with_scalar(np.float32, [ms / 1e3])
        client.execute(SLEEP, ac.CubeCount(1), bindings)
        return label

    return ac.Tunable(label, fn)


def raiser(message: str, calls: Counter[str], name: str) -> ac.Tunable[int, str]:
    """A tunable raising ValueError(message) in Python."""

    async def fn(client: ac.ComputeClient, n: int) -> str:
        calls[name] += 1
        raise ValueError(message)

    return ac.Tunable(name, fn)


def kernel_failer(calls: Counter[str], name: str) -> ac.Tunable[int, str]:
    """A tunable whose kernel fails on the worker (the error surfaces at an await)."""

    async def fn(client: ac.ComputeClient, n: int) -> str:
        calls[name] += 1
        h = client.empty(4)
        client.execute(FAIL, ac.CubeCount(1), ac.Bindings().with_buffers([h.binding()]))
        return name

    return ac.Tunable(name, fn)


def three_speeds(calls: Counter[str], version: str = "") -> ac.TunableSet[SizeKey, int, str]:
    """slow (5 ms, the default), medium (2 ms), fast (0 ms): fast must win."""
    return ac.TunableSet(
        size_key,
        version=version,
        tunables=[
            sleeper(5, calls, "slow"),
            sleeper(2, calls, "medium"),
            sleeper(0, calls, "fast"),
        ],
    )


def tuner(cache_dir: Any, name: str = "test_tune", **kwargs: Any) -> ac.Tuner:
    """A test tuner: few samples, results under ``cache_dir``."""
    kwargs.setdefault("samples", SAMPLES)
    kwargs.setdefault("warmup", 1)
    return ac.Tuner(name, cache_dir=cache_dir, persistent=True, **kwargs)
