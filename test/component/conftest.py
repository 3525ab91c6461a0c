"""The stepped-dispatcher harness of harness.py, shared by every component test module."""

from test.component.harness import harness_factory  # noqa: F401 - a fixture, registered by import
