"""Support for test suites (the pytest plugin's machinery): the loop-lag probe and the
device and client fixtures."""
