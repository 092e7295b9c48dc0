"""Benchmarks users can rerun: suites (prompts, references), methods, the run, the report."""
