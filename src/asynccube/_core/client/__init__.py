"""The client: :class:`~.client.ComputeClient` and its parts (commands, memory, arguments),
tensors, graphs, ``to_client`` transfers and array interop (DLPack).

May import: every server-side package (``server``, ``channel``, ``host``, ``cuda``) and below.
"""
