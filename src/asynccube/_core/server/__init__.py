"""The server side both servers share: the ``ComputeServer`` protocol (:mod:`.protocol`),
minting handles and binding them to memory slices (:mod:`.handles`), what graph captures
share, launch limits, tensor layouts and large host copies, and the effective settings
of new servers.

May import: the foundation, ``values``, ``config``, ``profiling``, ``memory``, ``stream``.
"""
