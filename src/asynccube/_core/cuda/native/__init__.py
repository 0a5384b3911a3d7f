"""The CUDA hot path's native code: each C file (``_native*.c``, one header ``_native.h``)
beside its pure-Python twin (``_twin*.py``), and :mod:`.hotpath`, which picks one at import.
``DESIGN.md`` here says which handle each part owns and who frees it.

May import: the foundation, ``values`` and :mod:`..driver` only (mechanism, not policy).
"""
