"""Servers' blocking preparation (compiling, pinning) runs off the loop, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client.client import ComputeClient

from .kernels import ADD, add_bindings, blocks

pytestmark = pytest.mark.asyncio


class SlowPreparingServer(ac.HostServer):
    """A host server whose hooks block for 20 ms, as compiling or pinning would."""

    def __init__(self, fail: str = "") -> None:
        super().__init__(max_streams=2)
        self.threads: list[tuple[str, int]] = []
        self.fail = fail

    def _job(self, what: str) -> Callable[[], None]:
        def job() -> None:
            time.sleep(0.02)
            self.threads.append((what, threading.get_ident()))
            if what == self.fail:
                raise ac.CompilationError(f"{what} failed", log="error: expected ';'")

        return job

    def prepare(self, kernel: ac.Kernel, count: Any = None, stream: Any = None) -> Any:
        return self._job(f"prepare {kernel.id}")

    def execute(self, kernel: ac.Kernel, *args: Any) -> None:
        self.threads.append((f"execute {kernel.id}", threading.get_ident()))
        super().execute(kernel, *args)

    def prepare_write(self, items: Any, stream: Any) -> Any:
        return self._job("write")

    def prepare_read(self, descriptors: Any, stream: Any) -> Any:
        return self._job("read")


async def _client(server: ac.HostServer) -> ComputeClient:
    return ComputeClient(server, asyncio.get_running_loop())


async def test_jobs_run_in_worker_threads_and_keep_order() -> None:
    server = SlowPreparingServer()
    client = await _client(server)
    a = client.create(np.arange(8, dtype=np.float32))
    out = client.empty(32)
    client.execute(ADD, blocks(8), add_bindings(a, a, out, 8))
    client.write([(a.copy_descriptor((8,), (1,), 4), np.ones(8, np.float32))])
    first = client.read_array(out, np.float32)
    second = client.read_array(a, np.float32)
    np.testing.assert_array_equal(await first, 2 * np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(await second, np.ones(8, np.float32))
    loop_thread = threading.get_ident()
    assert [w for w, _ in server.threads] == [
        "write",  # create(a)
        "prepare test_add_f32",
        "execute test_add_f32",
        "write",
        "read",
        "read",
    ]
    assert all(t != loop_thread for w, t in server.threads if not w.startswith("execute"))
    await client.close()


async def test_a_failed_compile_is_raised_at_the_next_await() -> None:
    server = SlowPreparingServer(fail="prepare test_add_f32")
    client = await _client(server)
    a = client.create(np.zeros(4, np.float32))
    client.execute(ADD, blocks(4), add_bindings(a, a, a, 4))
    with pytest.raises(ac.CompilationError, match="expected ';'"):
        await client.sync()
    assert not any(w.startswith("execute") for w, _ in server.threads)  # launch skipped
    assert await client.read([client.create(b"ok")]) == [b"ok"]
    await client.close()


async def test_a_failed_read_preparation_fails_that_read() -> None:
    server = SlowPreparingServer(fail="read")
    client = await _client(server)
    with pytest.raises(ac.CompilationError, match="read failed"):
        await client.read([client.create(b"x")])
    server.fail = ""
    assert await client.read([client.create(b"y")]) == [b"y"]
    await client.close()
