"""The host server's workers settle a completion (a read's, a sync's) only once they
count its task finished: whoever it wakes finds the stream idle. Before, the read's
caller could resume while its worker still ran the end of that task, and a DLPack
export right after ``await read_array(t)`` waited for the worker (3 ms at most) and, on a
loaded host, was refused: "the work queued on this tensor is still running"."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.channel.held import HeldErrors
from asynccube._core.host import interop_wait
from asynccube._core.host.tasks import completing
from asynccube._core.host.worker import HostCompletion, HostStream


def test_a_completion_is_settled_after_its_task_counts_as_finished() -> None:
    stream = HostStream(set())
    done: HostCompletion[int] = HostCompletion()
    seen: list[tuple[int, int]] = []
    woke = threading.Event()

    def on_done() -> None:  # runs where the completion is settled: the worker
        seen.append((stream.submitted, stream.finished))
        woke.set()

    done.add_done_callback(on_done)
    stream.submit(completing(done, lambda: 42, HeldErrors()))
    stream.flush()
    assert woke.wait(10)
    assert seen == [(1, 1)] and done.result() == 42
    failed: HostCompletion[int] = HostCompletion()
    stream.submit(completing(failed, lambda: 1 // 0, HeldErrors()))
    stream.flush()
    assert failed.wait(10)
    with pytest.raises(ZeroDivisionError):
        failed.result()
    assert stream.finished == stream.submitted == 2
    stream.stop(lambda: None)


def test_a_completion_whose_callback_raises_holds_the_error_and_the_worker_goes_on() -> None:
    stream = HostStream(set())
    done: HostCompletion[None] = HostCompletion()

    def broken() -> None:
        raise RuntimeError("a callback that fails")

    done.add_done_callback(broken)
    stream.submit(completing(done, lambda: None, HeldErrors()))
    after = threading.Event()
    stream.submit(after.set)
    stream.flush()
    assert after.wait(10)  # the worker went on
    error = stream.take_error()
    assert isinstance(error, ac.ExecutionError) and "a callback that fails" in str(error)
    stream.stop(lambda: None)


@pytest.mark.asyncio
async def test_an_export_right_after_an_awaited_read_never_waits_for_the_worker(
    host_client: ac.ComputeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_wait(event: Any) -> bool:
        raise AssertionError("the export waited for a worker the read had finished with")

    monkeypatch.setattr(interop_wait, "wait_briefly", must_not_wait)
    t = host_client.create_array(np.zeros(256, np.float32))
    for i in range(200):
        host_client.write([(t.copy_descriptor(), np.full(256, i, np.float32))])
        assert (await host_client.read_array(t))[0] == i
        assert np.from_dlpack(t)[0] == i
