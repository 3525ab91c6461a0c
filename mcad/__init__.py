"""mcad: a Kubernetes gang dispatcher for AppWrappers (a re-implementation of the Multi-Cluster App Dispatcher)."""

__version__ = "0.1.0"
