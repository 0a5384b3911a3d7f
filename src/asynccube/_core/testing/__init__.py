"""Support for test suites (the pytest plugin's machinery): the loop-lag probe and the
device and client fixtures.

May import: everything (it is the top layer of ``_core``).
"""
