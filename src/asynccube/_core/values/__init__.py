"""The vocabulary every layer speaks (cubecl-runtime's ``server.rs``, ``id.rs``,
``kernel.rs``): stream ids, handles and the value types, launch bindings, kernels, and the
slice token (``_native_slices.c`` beside its pure-Python twin in :mod:`.slices`).

May import: the foundation modules only (``errors``, ``extensions``, ``html``).
"""
