"""Speculative streams: configuration and parameters (embeddings, adapters, pruning head)."""
