"""Command-line entry points: ``mcad-controller`` (the controller process) and ``mcadctl`` (debug CLI)."""
