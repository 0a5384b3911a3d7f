"""The host byte storage and the ComputeStorage protocol."""

from __future__ import annotations

import numpy as np
import pytest

from asynccube._core.memory import BytesStorage, ComputeStorage, StorageHandle, StorageOutOfMemory

from .memory_fakes import FakeStorage


def test_alloc_gives_an_aligned_page_at_offset_zero() -> None:
    storage = BytesStorage(alignment=256)
    handle = storage.alloc(1000)
    assert handle == StorageHandle(handle.id, 0, 1000)
    view = storage.resource(handle)
    assert view.dtype == np.uint8
    assert view.size == 1000
    assert view.ctypes.data % 256 == 0


def test_resource_is_a_writable_view_of_the_range() -> None:
    storage = BytesStorage()
    handle = storage.alloc(128)
    storage.resource(handle)[:] = 0
    storage.resource(handle.sub(64, 16))[:] = 7
    whole = storage.resource(handle)
    assert whole[64:80].tolist() == [7] * 16
    assert not whole[:64].any()
    assert not whole[80:].any()


def test_storage_ids_and_dealloc() -> None:
    storage = BytesStorage()
    a, b = storage.alloc(10), storage.alloc(20)
    assert a.id != b.id
    assert sorted(storage.storage_ids()) == sorted([a.id, b.id])
    assert storage.allocated == 30
    storage.dealloc(a.id)
    storage.dealloc(a.id)  # unknown ids are ignored
    assert list(storage.storage_ids()) == [b.id]
    assert storage.allocated == 20
    with pytest.raises(KeyError):
        storage.resource(a)


def test_limit_raises_storage_out_of_memory() -> None:
    storage = BytesStorage(limit=100)
    storage.alloc(60)
    with pytest.raises(StorageOutOfMemory) as info:
        storage.alloc(41)
    assert info.value.size == 41
    storage.alloc(40)


def test_alignment_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        BytesStorage(alignment=48)


@pytest.mark.parametrize("storage", [BytesStorage(), FakeStorage()])
def test_storages_follow_the_protocol(storage: object) -> None:
    assert isinstance(storage, ComputeStorage)


def test_storage_handle_ranges() -> None:
    handle = StorageHandle(3, 100, 50)
    assert handle.end == 150
    assert handle.sub(10, 5) == StorageHandle(3, 110, 5)
