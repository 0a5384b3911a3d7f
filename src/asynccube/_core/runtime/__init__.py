"""Finding devices, making the server for a device string, and opening clients.

May import: everything up to ``tune``.
"""
