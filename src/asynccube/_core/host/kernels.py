"""The task of one host kernel launch: the kernel's host function over numpy views of
its bindings, run on a worker thread; the launch limits checked (those of a GPU, so a
kernel that runs here runs there), a count with a zero dimension (UNCHECKED) running
nothing, as on a GPU, and views kept past the launch refused."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgument
from ..server.launch_limits import HOST_LIMITS, check_launch
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import HostLaunch, Kernel, LaunchGuard, launch_maps, launch_views
from ..values.types import Binding, ExecutionMode

__all__ = ["kernel_task", "read_count"]

View = npt.NDArray[np.uint8]


def kernel_task(
    kernel: Kernel,
    count: CubeCount,
    bindings: Bindings,
    mode: ExecutionMode,
    view: Callable[[Binding], View],
) -> tuple[Callable[[], None], list[Binding]]:
    """The task running ``kernel`` over ``bindings`` (``view``: a binding's bytes), and
    the bindings it uses: it keeps them (so every slice) alive until it has run."""
    fn = kernel.host_part("host")
    used = list(bindings.buffers)
    views = [view(b) for b in used] if used else []
    maps = []
    if bindings.tensor_maps:
        maps = [(t, view(t.binding)) for t in bindings.tensor_maps]
        used += [t.binding for t in bindings.tensor_maps]
    count_view = None
    if count.binding is not None:
        count_view = _count_view(count.binding, view)
        used.append(count.binding)
    scalars = {dt: sb.values() for dt, sb in bindings.scalars.items()} if bindings.scalars else {}
    metadata = bindings.metadata.data
    static = (count.x, count.y, count.z)
    checked = mode is ExecutionMode.CHECKED
    if checked and count_view is None:  # the GPU's limits, so no surprise on a GPU
        check_launch(kernel.id, "host", static, HOST_LIMITS, kernel.cuda)

    def run() -> None:
        # ``used`` keeps every binding (so every slice) alive until the kernel has run.
        dims = static
        if count_view is not None:
            dims = read_count(count_view)
            if checked:
                check_launch(kernel.id, "host", dims, HOST_LIMITS, kernel.cuda)
        if not (dims[0] and dims[1] and dims[2]):  # no cube: a GPU launches nothing
            used.clear()
            return
        handed = launch_views(views) if views else []
        launch = HostLaunch(handed, scalars, metadata, dims, launch_maps(maps))
        guard = LaunchGuard(launch)  # views kept past the launch fail it (kernel.py)
        guard.arm()
        try:
            fn(launch)
        except BaseException:
            guard.failed(used)  # what it may have kept still reserves its buffers
            used.clear()
            raise
        kept = guard.check(kernel.id, used)
        used.clear()
        if kept is not None:
            del launch, handed  # the error's traceback holds this frame: no view in it
            raise kept

    return run, used


def _count_view(binding: Binding, view: Callable[[Binding], View]) -> View:
    if binding.size < 12:
        raise InvalidArgument(
            f"a dynamic CubeCount needs 12 bytes (uint32 x, y, z); {binding!r} has {binding.size}"
        )
    return view(binding)


def read_count(view: View) -> tuple[int, int, int]:
    """A dynamic cube count: the ``uint32`` triple at the start of ``view``."""
    x, y, z = (int(v) for v in view[:12].view(np.uint32))
    return x, y, z
