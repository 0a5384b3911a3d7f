"""Progress of long work (a tuning run over a key's implementations, the demo's tasks):
a bar drawn by ``tqdm.auto`` (a widget in Jupyter, text in a terminal) where tqdm is
installed. Silent when tqdm is missing, when neither a terminal nor a notebook shows it,
or when the caller disables it (``[autotune] progress = false`` for tuning)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from .backend import to_thread

__all__ = ["Progress", "interactive", "open_progress"]


class Progress:
    """Advances a bar, or does nothing when there is none."""

    __slots__ = ("_bar",)

    def __init__(self, bar: Any = None) -> None:
        self._bar = bar

    @property
    def shown(self) -> bool:
        """True when a bar is drawn."""
        return self._bar is not None

    def step(self, label: str) -> None:
        """One item done; ``label`` names it beside the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        """Remove the bar (idempotent)."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()


def interactive() -> bool:
    """True when a person can see progress: stderr is a terminal, or a notebook runs."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except ValueError:  # a closed stream
        return False
    shell = sys.modules.get("IPython")
    get_ipython = getattr(shell, "get_ipython", None)
    return get_ipython is not None and type(get_ipython()).__name__ == "ZMQInteractiveShell"


async def open_progress(total: int, description: str, *, enabled: bool = True) -> Progress:
    """A bar of ``total`` steps, or a silent :class:`Progress` (see the module doc).
    The bar is made in a worker thread (see :func:`_new_bar`)."""
    if not enabled or total < 1 or not interactive():
        return Progress()
    return Progress(await to_thread(_new_bar, total, description))


def _new_bar(total: int, description: str) -> Any:
    """A tqdm bar, or None without tqdm. Made in a worker thread: the first one imports
    tqdm, creates its lock and starts its monitor thread, each too slow for the loop."""
    bar_class = _tqdm_class()
    if bar_class is None:
        return None
    return bar_class(total=total, desc=description, leave=False, dynamic_ncols=True)


def _tqdm_class() -> Any:
    """``tqdm.auto.tqdm``, or None where tqdm is not installed."""
    try:
        return importlib.import_module("tqdm.auto").tqdm
    except ImportError:
        return None
