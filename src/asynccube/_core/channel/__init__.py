"""The channel (cubecl's ``ComputeChannel``): one actor task drains a client's commands into
its server (:mod:`.channel`), how they settle, errors held per stream, completion
watching, the awaitables a client returns, and the event-loop backends (asyncio, trio).

May import: everything below ``server`` and ``server`` itself; never a concrete server.
"""
