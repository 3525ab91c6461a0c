"""Benchmarks on throwaway local clusters (issue 4): ``make bench`` runs ``python -m test.perf.bench``."""
