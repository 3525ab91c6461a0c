"""Benchmarks on throwaway local clusters: ``make bench`` runs ``python -m test.perf.bench``."""
