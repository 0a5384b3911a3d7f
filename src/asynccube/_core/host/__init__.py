"""The host server: the embedded default server, on numpy, with a worker thread per stream.

May import: everything up to ``channel`` (held errors); never ``cuda`` or the client.
"""
