"""The bookkeeping behind CUDA exports, run without a GPU: leases that keep a closed
client's memory until the last DLPack deleter, and the gates that order a consumer's
stream after commands not issued yet (the driver's stream memory operations replaced
by a fake that records them, the pinned words by host memory)."""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from typing import Any

import pytest

from asynccube._core.cuda import exports
from asynccube._core.cuda.exports import ExportLeases, Gates
from asynccube._core.errors import CudaDriverError


class FakeDriver:
    """What :mod:`asynccube._core.cuda.exports` calls of ``cuda.bindings.driver``."""

    CU_MEMHOSTALLOC_DEVICEMAP = 2
    CU_MEMHOSTALLOC_PORTABLE = 1

    def __init__(self) -> None:
        self.pages: list[Any] = []
        self.waits: list[tuple[Any, int, int]] = []
        self.writes: list[tuple[Any, int, int]] = []
        self.freed: list[int] = []

    def cuMemHostAlloc(self, size: int, flags: int) -> tuple[int, int]:
        assert flags == 3
        page = (ctypes.c_char * size)()
        self.pages.append(page)
        return 0, ctypes.addressof(page)

    def cuMemHostGetDevicePointer(self, host: int, flags: int) -> tuple[int, int]:
        return 0, host + (1 << 40)  # a device address distinct from the host one

    def cuStreamWaitValue32(self, stream: Any, addr: int, value: int, flags: int) -> tuple[int]:
        assert flags == 0  # greater-or-equal
        self.waits.append((stream, addr, value))
        return (0,)

    def cuStreamWriteValue32(self, stream: Any, addr: int, value: int, flags: int) -> tuple[int]:
        self.writes.append((stream, addr, value))
        return (0,)

    def land(self) -> None:
        """The device runs the queued writes (on host memory: device address - 2**40)."""
        for _, addr, value in self.writes:
            ctypes.c_uint32.from_address(addr - (1 << 40)).value = value
        self.writes.clear()

    def cuMemFreeHost(self, host: int) -> tuple[int]:
        self.freed.append(host)
        return (0,)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    fake = FakeDriver()
    monkeypatch.setattr(exports, "cu", lambda: fake)
    return fake


def _word(address: int) -> int:
    return ctypes.c_uint32.from_address(address).value


def test_a_lease_defers_the_release_to_the_last_export() -> None:
    leases = ExportLeases()
    ran: list[str] = []
    assert leases.after_last(lambda: ran.append("now"))  # none live: at once
    assert ran == ["now"]
    owner = object()
    first, second = leases.take(owner), leases.take(None)
    assert first.keep is owner and leases.live == 2
    released = threading.Event()
    assert not leases.after_last(
        lambda: (ran.append(threading.current_thread().name), released.set())
    )
    del first
    gc.collect()
    assert leases.live == 1 and not released.is_set()
    del second  # the last deleter: the release runs, on a thread of its own
    assert released.wait(5)
    assert leases.live == 0 and ran[-1] != threading.current_thread().name


def test_a_gate_orders_the_consumer_after_the_queued_work(driver: FakeDriver) -> None:
    gates = Gates()
    gate = gates.wait("consumer")
    ((stream, addr, value),) = driver.waits
    assert stream == "consumer" and value == 1 and addr == gates.device_address(gate.address)
    assert _word(gate.address) == 0  # the consumer's stream waits
    gate.open_on("asynccube")
    assert driver.writes == [("asynccube", addr, 1)] and gate.opened
    gate.open_now()  # opened once only
    assert _word(gate.address) == 0


def test_a_word_is_reused_only_once_its_write_landed(driver: FakeDriver) -> None:
    gates = Gates()
    first = gates.wait("c")
    address = first.address
    first.open_on("s")
    others = [gates.wait("c") for _ in range(exports._SLOTS - 1)]  # every other word
    assert address not in {g.address for g in others}
    for g in others:
        g.open_now()
    for _ in range(2 * exports._SLOTS):  # words opened from the host are reused at once
        g = gates.wait("c")
        assert g.address != address  # its device write has not landed yet
        g.open_now()
    driver.land()
    for _ in range(2 * exports._SLOTS):
        g = gates.wait("c")
        if g.address == address:
            assert g.value == 2  # the next value: a waiter for it needs the new write
            break
        g.open_now()
    else:
        pytest.fail("the word was never reused after its write landed")


def test_a_dropped_or_refused_gate_opens_itself(driver: FakeDriver) -> None:
    gates = Gates()
    gate = gates.wait("c")
    address = gate.address
    del gate  # its command was dropped (the client closed or died): the host opens it
    gc.collect()
    assert _word(address) == 1
    gates.close()
    assert driver.freed and gates.closed
    late = exports.Gate(gates, address, 7)  # a gate outliving its pages writes nothing
    late.open_now()
    assert _word(address) == 1


def test_a_gate_still_closed_at_the_deadline_is_opened_with_a_warning(
    driver: FakeDriver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(exports, "GATE_TIMEOUT_SECONDS", 0.05)
    gates = Gates()
    with caplog.at_level(logging.WARNING, logger="asynccube.interop"):
        gate = gates.wait("c")
        deadline = time.monotonic() + 5
        while not gate.opened and time.monotonic() < deadline:
            time.sleep(0.01)
    assert gate.opened and _word(gate.address) == gate.value
    assert "synchronized on the loop's thread" in caplog.text
    opened = gates.wait("c")
    opened.open_on("s")  # opened in time: no warning
    caplog.clear()
    time.sleep(0.15)
    assert not caplog.text


def test_a_gate_the_driver_cannot_write_opens_from_the_host(
    driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    gates = Gates()
    gate = gates.wait("c")
    monkeypatch.setattr(driver, "cuStreamWriteValue32", lambda *args: (999,))
    with pytest.raises(CudaDriverError, match="cuStreamWriteValue32"):
        gate.open_on("s")  # fired: the channel holds this error for the stream
    assert gate.opened and _word(gate.address) == gate.value  # no consumer waits forever
