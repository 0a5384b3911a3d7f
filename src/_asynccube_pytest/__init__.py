"""The light half of asynccube's pytest plugin (entry point ``pytest11`` named
``asynccube.pytest_plugin``; its public face is :mod:`asynccube.pytest_plugin`).

pytest loads it into every run of an environment where asynccube is installed, most of
them runs of projects that never import asynccube: it imports only the standard library
and pytest, acts only on tests that use its fixtures or its markers, and imports
asynccube (:mod:`asynccube._core.testing.plugin`) only for those. ``-p
no:asynccube.pytest_plugin`` turns it off.
"""
