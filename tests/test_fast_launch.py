"""The one-call routes (``cuda/fast.py``), compiled and pure-Python twin, without a
GPU: their argument checks here, and the client -> CudaServer scenarios of
``fast_launch_scenario.py`` (launches, reads, syncs), ``fast_alloc_scenario.py``
(allocations), ``fast_expandable_scenario.py`` (the expandable pool) and
``fast_peer_scenario.py`` (``to_client`` between two clients of one device) and
``fast_reduce_scenario.py`` (a whole-tensor ``ac.reduction`` call) in processes
of their own on the no-op driver of ``benchmarks/bench_overhead.py`` (a GPU runs the
same routes in every CUDA test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pytest

from asynccube._core.errors import InvalidArgument

from .conftest import native_module

SCENARIOS = {
    "fast_launch_scenario.py": (
        "taken", "declined", "scalar_dtype", "scalar_groups", "other_stream", "new_task",
        "launch_error",
        "foreign_handle", "zero_count", "read_tensor_item", "profiling", "read_taken",
        "read_declined", "read_error", "sync_taken", "sync_wakes_once", "sync_overlapped",
        "wait_taken",
        "spins_once", "under_trio",
        "queued", "first_use", "write_one",
        "closed",
    ),
    "fast_defer_scenario.py": (
        "defer_concurrent", "defer_later_work", "defer_after_long_spins", "defer_shared_slot",
        "defer_slow_device",
        "defer_flushed",
        "defer_cancelled", "defer_other_loop", "defer_checks", "read_allocates_off_the_loop",
    ),
    "fast_dlpack_scenario.py": (
        "dlpack_import_waits_on_the_legacy_stream",
        "dlpack_import_keeps_the_producer_until_dropped", "dlpack_calls_per_exchange",
        "dlpack_export_in_one_call",
    ),
    "fast_exclusive_scenario.py": ("exclusive_held", "exclusive_own"),
    "fast_reduce_scenario.py": (
        "reduce_calls_launch_twice", "reduce_partials_per_stream", "reduce_failure_not_carried",
    ),
    "fast_propagate_scenario.py": ("propagate_skipped", "propagate_before_compile"),
    "fast_warm_up_scenario.py": (
        "warm_up_compiles_and_issues_nothing", "warm_up_route_steps_aside",
        "warm_up_first_request_takes_the_routes",
        "warm_up_first_requests_cost_what_the_hundredth_does",
    ),
    "fast_ahead_scenario.py": (
        "ahead_taken", "ahead_declined", "ahead_untracked", "ahead_read_into", "ahead_write",
        "ahead_concurrent", "ahead_records",
    ),
    "fast_write_scenario.py": (
        "write_taken", "write_in_flight", "write_declined", "write_error", "write_connected",
        "write_large_helped", "read_into_off_the_loop",
    ),
    "fast_alloc_scenario.py": (
        "alloc_taken", "alloc_declined", "alloc_passed", "alloc_other_task", "alloc_create",
        "alloc_errors", "alloc_after_read", "alloc_carried",
    ),
    "fast_expandable_scenario.py": (
        "expandable_taken", "expandable_grows_in_place", "expandable_cleanup_race",
    ),
    "fast_peer_scenario.py": (
        "peer_inline", "peer_queued", "peer_busy_source", "peer_busy_dest", "peer_errors",
        "peer_dead_dest", "peer_cancelled_dest", "peer_cancelled_source",
        "peer_two_devices", "peer_back_to_back",
    ),
}  # fmt: skip


class _Closed:
    """A channel that is not open: every launch is left to the route."""

    state = "closed"


def _args(channel: Any = None) -> list[Any]:
    objs: list[Any] = [_Closed() if channel is None else channel, object(), "open"]
    objs += [None] * 4 + [ContextVar("p", default=None), ContextVar("o", default=None)]
    objs += [type(None)] * 4 + [object(), {}, {}, object(), {}, {}, [None], object()]
    objs += [None] * 9
    return [*objs, 32]  # 30 objects, then max_streams


def test_the_argument_count_is_checked(hot: Any) -> None:
    with pytest.raises(InvalidArgument, match="31 arguments"):
        hot.FastLaunch(*_args()[:-1])


def test_max_streams_is_checked(hot: Any) -> None:
    with pytest.raises(InvalidArgument, match="max_streams"):
        hot.FastLaunch(*_args()[:-1], 0)


def test_a_closed_channel_is_left_to_the_route(hot: Any) -> None:
    fast = hot.FastLaunch(*_args())
    assert fast(None, None, None, None) is False
    assert fast(1, 2, 3, 4) is False
    assert tuple(fast.stats) == (0, 2)
    with pytest.raises(TypeError):
        fast(1, 2, 3)


def test_a_queued_launch_on_a_closed_channel_is_left_to_the_route(hot: Any) -> None:
    fast = hot.FastLaunch(*_args())
    assert fast.queued(None, None, None, None, None) is False
    assert fast.queued(1, 2, 3, 4, 5) is False
    assert tuple(fast.queued_stats) == (0, 2)
    assert tuple(fast.stats) == (0, 0)  # counted apart from the callers' launches
    with pytest.raises(TypeError):
        fast.queued(1, 2, 3, 4)


def test_set_pointers_takes_a_callable(hot: Any) -> None:
    fast = hot.FastLaunch(*_args())
    with pytest.raises(InvalidArgument, match="set_pointers needs a callable"):
        fast.set_pointers(42)
    fast.set_pointers(lambda binding: 0)
    assert fast(1, 2, 3, 4) is False  # the channel is closed: the route, as before


def test_set_footprint_checks_its_argument(hot: Any) -> None:
    from asynccube._core.channel.footprint import Footprint

    fast = hot.FastLaunch(*_args())
    for bad in (object(), type("F", (), {"streams": {}, "buffers": []})()):
        with pytest.raises(InvalidArgument, match="set_footprint needs"):
            fast.set_footprint(bad)
    fast.set_footprint(Footprint())
    assert fast(1, 2, 3, 4) is False  # the channel is closed: the route, as before


def test_set_alloc_checks_its_arguments(hot: Any) -> None:
    from collections import deque

    from asynccube._core.values.slices import SliceHandle
    from asynccube._core.values.types import Handle

    fast = hot.FastLaunch(*_args())
    assert fast.empty(1024) is None  # set_alloc not called: the route
    good = [Handle, SliceHandle, iter(range(3)), {}, {}, deque(), {}, object(), {}, deque()]
    with pytest.raises(InvalidArgument, match="set_alloc needs"):
        fast.set_alloc(*good[:3], [], *good[4:], 1 << 20)  # a list, not the slice dict
    with pytest.raises(InvalidArgument, match="size >= 0"):
        fast.set_alloc(*good, -1)

    class Plain:
        pass

    with pytest.raises(InvalidArgument, match="__slots__"):
        fast.set_alloc(Plain, *good[1:], 1 << 20)
    fast.set_alloc(*good, 1 << 20)
    assert fast.empty(1024) is None  # the channel is closed: the route
    assert fast.empty("1024") is None
    assert tuple(fast.stats) == (0, 2)


def test_set_write_checks_its_arguments(hot: Any) -> None:
    fast = hot.FastLaunch(*_args())
    assert fast.write(1, b"x") is False  # set_write not called: the route
    for bad in (([], 64, len), ({}, -1, len), ({}, 64, 42)):
        with pytest.raises(InvalidArgument, match="set_write needs"):
            fast.set_write(*bad)
    with pytest.raises(TypeError):
        fast.set_write({}, "64", len)
    fast.set_write({}, 64, lambda n: None)
    with pytest.raises(TypeError):
        fast.write(1)
    with pytest.raises(TypeError):
        fast.write(1, b"x", 3)
    assert fast.write(None, None) is False  # the channel is closed: the route
    assert fast.write(1, b"x") is False
    assert tuple(fast.write_stats) == (0, 2)
    assert tuple(fast.stats) == (0, 0)  # counted apart from the other routes


def _run(script: str, env_twin: bool) -> subprocess.CompletedProcess[str]:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the no-op libcuda.so.1")
    try:
        from asynccube._core.cuda import compiler

        compiler.nvrtc_version()
    except Exception as exc:
        pytest.skip(f"NVRTC is not available: {exc}")
    env = dict(os.environ)
    env["ASYNCCUBE_NO_EXTENSIONS"] = "1" if env_twin else ""
    env["PYTHONPATH"] = os.pathsep.join([*sys.path, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script))],
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("twin", [False, True], ids=["native", "python"])
@pytest.mark.parametrize("script", sorted(SCENARIOS))
def test_scenarios_on_the_client_path(script: str, twin: bool) -> None:
    if not twin and native_module() is None:
        pytest.skip("the compiled extension is not built here (pip install . builds it)")
    out = _run(script, twin)
    assert out.returncode == 0, out.stdout + out.stderr
    path = "python" if twin else "native"
    for name in SCENARIOS[script]:
        assert f"ok {name} {path}" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("script", sorted(SCENARIOS))
def test_the_scenarios_are_all_run(script: str) -> None:
    source = Path(__file__).with_name(script).read_text()
    assert sorted(SCENARIOS[script]) == sorted(
        line.split("(")[0].removeprefix("async def ")
        for line in source.splitlines()
        if line.startswith("async def ")
    )
