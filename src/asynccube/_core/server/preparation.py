"""What a server reports of a kernel a warm-up scope prepared (``client.warm_up()``).

A server that compiles or loads kernels may offer the optional hook
``warm_up_launch(kernel, count, bindings, mode, stream)``, called on the actor in stream
order for a launch a warm-up scope drops: it makes the checks a launch makes before it
runs (raising as that launch would), and returns the blocking job that compiles and
loads the kernel, to be run in a worker thread, or None when there is nothing to do
(the kernel is loaded already, or the server needs no compile: the host server). The
job returns a :class:`KernelPrepared`. A server without the hook prepares nothing.
The checks a first launch makes once per signature and grid (the CUDA server's) are made
there too, so the first real launch after a warm-up takes the one-call route.

A server may also offer ``warm_up_read(descriptors)``, called on the actor for a read a
warm-up pass ends on (its buffer carries ``LaunchDropped``: nothing is read): it
allocates the staging a read of that size takes (the CUDA server's page-locked spare for
a small read), so the first real read does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["CACHE_ORIGINS", "KernelPrepared"]

CACHE_ORIGINS: Final = frozenset({"memory", "disk"})
"""The origins of a cubin found in the compile cache (not compiled)."""


@dataclass(frozen=True, slots=True)
class KernelPrepared:
    """A kernel compiled (or found in the compile cache) and loaded by a warm-up job.

    Attributes:
        origin: ``"compiled"`` (the compiler ran), ``"memory"`` or ``"disk"`` (found in
            the compile cache's memory or disk level).
        stored: Whether the compiled result was written to the disk cache.
    """

    origin: str
    stored: bool = False
