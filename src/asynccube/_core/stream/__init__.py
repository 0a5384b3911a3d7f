"""Streams (cubecl's ``stream``): multi-stream events and cursors, the stream pool and the
scheduler.

May import: the foundation, ``values`` and ``config``.
"""
