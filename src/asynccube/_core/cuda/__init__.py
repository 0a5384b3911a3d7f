"""The CUDA backend: driver access, NVRTC compilation, the kernel ABI, completion, storage.

Nothing here imports ``cuda.bindings`` at import time: the driver is reached lazily, so
``import asynccube`` works on machines without a GPU or driver, and
:func:`driver.driver_available` says why CUDA cannot be used there.

May import: everything up to ``host`` (its worker threads); never the client.
"""
