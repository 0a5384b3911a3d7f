"""The tune cache's file: reading it (unreadable or corrupt files are logged and
treated as empty), and merging one entry under an exclusive lock with an atomic replace
(see :mod:`.cache` for the layout and the guarantees)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ..config.logging import area_logger
from ..version import __version__

fcntl: Any
try:  # POSIX; elsewhere writes are still atomic, but concurrent merges may lose one
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["FILE_FORMAT"]

log = area_logger("autotune")

FILE_FORMAT: Final = 1
"""Version of the on-disk layout; a file of another format is ignored (and replaced)."""


def _read_entries(path: Path, device: str, tuner: str) -> dict[str, Any]:
    """The entries of the cache file; {} (with a warning) if unreadable or corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("autotune cache %s is unreadable (%s); tuning afresh", path, exc)
        return {}
    return _parse_file(raw, path, device, tuner)


def _parse_file(raw: bytes, path: Path, device: str, tuner: str) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        log.warning("autotune cache %s is corrupt (%s); tuning afresh", path, exc)
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        log.warning("autotune cache %s is not an autotune cache file; tuning afresh", path)
        return {}
    if data.get("format") != FILE_FORMAT:
        log.info(
            "autotune cache %s has format %r, not %d; ignoring it",
            path,
            data.get("format"),
            FILE_FORMAT,
        )
        return {}
    entries: dict[str, Any] = data["entries"]
    return entries


def _file_doc(device: str, tuner: str, entries: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FILE_FORMAT,
        "asynccube": __version__,
        "device": device,
        "tuner": tuner,
        "entries": entries,
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (a lock file next to the cache file)."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _merge_entry(path: Path, device: str, tuner: str, key_id: str, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_name(path.name + ".lock")):
        entries = _read_entries(path, device, tuner)
        entries[key_id] = record
        _atomic_write(path, json.dumps(_file_doc(device, tuner, entries), separators=(",", ":")))


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
