"""Profiling: the bookkeeping of tokens and per-kernel records (:mod:`.records`), timelines
(Chrome trace / Perfetto JSON and plots) and their HTML displays for Jupyter.

May import: the foundation, ``values`` and ``config``.
"""
