"""Baselines the benchmarks compare Speculative Streaming with."""
