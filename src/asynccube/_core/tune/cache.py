"""The tune cache: results in memory (pending / done) and on disk (cubecl's ``TuneCache``).

On disk, one JSON file per tuner and device::

    <cache_dir>/<asynccube version>/<device fingerprint>/<tuner name>.json

holding, per key, the tunable set's checksum, the fastest implementation and every
outcome (timings, or the error of an implementation that failed). A stored result is
used only when its checksum matches the tunable set's; otherwise the key is retuned.

Where the code is: this module keeps the cache and where its file lives;
:mod:`.outcome` the outcomes and results, :mod:`.store` reading and writing the file.

Robustness: a file that cannot be read or parsed, or an entry that is malformed, is
reported once on the ``asynccube.autotune`` logger (WARNING) and treated as absent (the
key is tuned afresh, and the next write replaces the file): never an exception.
Writers take an exclusive ``fcntl`` lock on ``<file>.lock``, re-read the file, merge
their entry and replace the file atomically (temporary file + ``os.replace``), so two
processes tuning at once lose nothing and readers never see a torn file. Every disk
access runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..channel.backend import running_loop, shield, to_thread
from ..config.logging import area_logger
from ..errors import AutotuneError, ConfigError
from ..version import __version__
from .key import AutotuneKey
from .outcome import AutotuneOutcome, TuneResult
from .store import _merge_entry as _merge_entry
from .store import _read_entries as _read_entries

if TYPE_CHECKING:
    from ..client.client import ComputeClient

__all__ = ["AutotuneOutcome", "TuneCache", "TuneResult", "device_fingerprint"]

log = area_logger("autotune")

FILE_FORMAT: Final = 1
"""Version of the on-disk layout; a file of another format is ignored (and replaced)."""
# -- where the file lives -------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _slug(text: str) -> str:
    out = _UNSAFE.sub("_", text).strip("._")
    return out[:120] or "_"


def device_fingerprint(client: ComputeClient) -> str:
    """What results are namespaced by: the device string and the device's name
    (``"cuda:0 NVIDIA H100 80GB HBM3"``, ``"host numpy host server"``)."""
    return f"{client.device} {client.properties.name}"


def _config_cache() -> tuple[bool, Path]:
    """``[autotune] cache`` and ``cache_dir`` from the configuration (blocking)."""
    from ..config.config import default_cache_dir, load_config

    try:
        cfg = load_config().autotune
    except ConfigError as exc:
        log.warning("autotune: cannot read the configuration (%s); using defaults", exc)
        return True, default_cache_dir("autotune")
    return cfg.cache, Path(cfg.cache_dir)


# -- the cache ------------------------------------------------------------------------


class TuneCache:
    """Tuning results of one tuner on one device: in memory, and on disk.

    Args:
        name: The tuner's name (the file's name).
        device: The device fingerprint (see :func:`device_fingerprint`).
        cache_dir: Root of the on-disk cache. ``None``: ``[autotune] cache_dir`` from the
            configuration (default ``$XDG_CACHE_HOME/asynccube/autotune``, else
            ``~/.cache/asynccube/autotune``).
        persistent: Keep results on disk. ``None``: ``[autotune] cache`` from the
            configuration (default true).

    In memory a key is *pending* (a tuning task runs for it), *done* (a
    :class:`TuneResult`) or *failed* (every implementation failed: the
    :class:`~asynccube.AutotuneError` is kept so that it is raised again without
    retuning; :meth:`forget` clears it). Pending and failed entries never reach disk.
    """

    def __init__(
        self,
        name: str,
        device: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        persistent: bool | None = None,
    ) -> None:
        self.name = name
        self.device = device
        self._cache_dir = None if cache_dir is None else Path(cache_dir).expanduser()
        self._persistent = persistent
        self._path: Path | None = None
        self._resolved = False
        self._done: dict[AutotuneKey, TuneResult] = {}
        self._pending: dict[AutotuneKey, asyncio.Task[TuneResult]] = {}
        self._failed: dict[AutotuneKey, tuple[str, AutotuneError]] = {}
        self._disk: dict[str, Any] | None = None
        self._loading: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return (
            f"TuneCache({self.name!r}, {self.device!r}, done={len(self._done)}, "
            f"pending={len(self._pending)}, path={self._path})"
        )

    # -- memory ---------------------------------------------------------------------

    def get(self, key: AutotuneKey, checksum: str | None = None) -> TuneResult | None:
        """The result for ``key`` in memory (None if absent or of another checksum)."""
        result = self._done.get(key)
        if result is None or (checksum is not None and result.checksum != checksum):
            return None
        return result

    def failure(self, key: AutotuneKey, checksum: str) -> AutotuneError | None:
        """The error of a tuning run for ``key`` (with a set of ``checksum``) in which
        every implementation failed."""
        kept = self._failed.get(key)
        return kept[1] if kept is not None and kept[0] == checksum else None

    def pending(self, key: AutotuneKey) -> asyncio.Task[TuneResult] | None:
        """The tuning task running for ``key`` on the running loop, if any."""
        task = self._pending.get(key)
        if task is None or task.done():
            return None
        if task.get_loop() is not running_loop():
            return None
        return task

    def mark_pending(self, key: AutotuneKey, task: asyncio.Task[TuneResult]) -> None:
        """Record that ``task`` tunes ``key``; the entry goes when the task ends."""
        self._pending[key] = task
        task.add_done_callback(lambda t: self._unmark(key, t))

    def _unmark(self, key: AutotuneKey, task: asyncio.Task[TuneResult]) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]

    def insert(self, key: AutotuneKey, result: TuneResult) -> None:
        """Remember ``result`` for ``key`` (in memory)."""
        self._failed.pop(key, None)
        self._done[key] = result

    def insert_failure(self, key: AutotuneKey, checksum: str, error: AutotuneError) -> None:
        """Remember that tuning ``key`` failed (in memory only)."""
        self._failed[key] = (checksum, error)

    def forget(self, key: AutotuneKey | None = None) -> None:
        """Drop ``key`` (or every key) from memory; the disk is left as it is."""
        if key is None:
            self._done.clear()
            self._failed.clear()
        else:
            self._done.pop(key, None)
            self._failed.pop(key, None)

    def results(self) -> dict[AutotuneKey, TuneResult]:
        """A copy of the results in memory."""
        return dict(self._done)

    def tasks(self) -> list[asyncio.Task[TuneResult]]:
        """Tuning tasks still running."""
        return [t for t in self._pending.values() if not t.done()]

    # -- disk -----------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The cache file (None until resolved by :meth:`load`, or when not persistent)."""
        return self._path

    def _resolve(self) -> None:
        """Settle the file's path (blocking: may read the configuration)."""
        if self._resolved:
            return
        persistent, root = self._persistent, self._cache_dir
        if persistent is None or (persistent and root is None):
            cfg_persistent, cfg_root = _config_cache()
            persistent = cfg_persistent if persistent is None else persistent
            root = root or cfg_root
        if persistent and root is not None:
            device_dir = root / _slug(__version__) / _slug(self.device)
            self._path = device_dir / f"{_slug(self.name)}.json"
        self._resolved = True

    async def load(self) -> None:
        """Read the cache file once (in a worker thread); later calls return at once."""
        if self._disk is not None:
            return
        loading = self._loading
        loop = running_loop()
        if loading is None or loading.get_loop() is not loop:
            loading = self._loading = loop.create_task(self._load())
        await shield(loading)

    async def _load(self) -> None:
        try:
            entries = await to_thread(self._load_blocking)
        except Exception as exc:  # a bug or an odd filesystem: tune without the disk
            log.warning(
                "autotune cache for %s could not be loaded (%r); tuning afresh", self.name, exc
            )
            entries = {}
        if self._disk is None:
            self._disk = entries

    def _load_blocking(self) -> dict[str, Any]:
        self._resolve()
        if self._path is None:
            return {}
        return _read_entries(self._path, self.device, self.name)

    def persisted(self, key: AutotuneKey, checksum: str) -> TuneResult | None:
        """The stored result for ``key`` if its checksum is ``checksum`` (after
        :meth:`load`). A stale or malformed entry is dropped (and logged)."""
        if not self._disk:
            return None
        record = self._disk.get(key.to_json())
        if record is None:
            return None
        try:
            result = TuneResult.from_dict(record)
        except (KeyError, TypeError, ValueError, AutotuneError) as exc:
            log.warning(
                "autotune cache %s: malformed entry for %s (%s); retuning", self._path, key, exc
            )
            self._disk.pop(key.to_json(), None)
            return None
        if result.checksum != checksum:
            log.info(
                "autotune %s: the tunable set changed since %s was tuned; retuning", self.name, key
            )
            self._disk.pop(key.to_json(), None)
            return None
        return result

    async def persist(self, key: AutotuneKey, result: TuneResult) -> bool:
        """Merge ``result`` for ``key`` into the cache file (in a worker thread); True
        once written (False: not persistent, or the write failed).

        Never raises for I/O problems: an unwritable directory is logged and costs only
        the persistence.
        """
        record = result.to_dict(key)
        key_id = key.to_json()
        written: bool = await to_thread(self._persist_blocking, key_id, record)
        if written and self._disk is not None:
            self._disk[key_id] = record
        return written

    def _persist_blocking(self, key_id: str, record: dict[str, Any]) -> bool:
        self._resolve()
        if self._path is None:
            return False
        try:
            _merge_entry(self._path, self.device, self.name, key_id, record)
        except OSError as exc:
            log.warning(
                "autotune cache %s could not be written (%s); results are kept in memory only",
                self._path,
                exc,
            )
            return False
        return True
