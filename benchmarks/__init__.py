"""Benchmarks: launch overhead, operator scale, gang restart. See benchmarks/RESULTS.md."""
