"""The stepped-dispatcher harness of test_dispatcher.py, shared by every component test module."""

from test.component.test_dispatcher import harness_factory  # noqa: F401 - a fixture, registered by import
