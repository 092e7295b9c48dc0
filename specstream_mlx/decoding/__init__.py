"""Decoders: each turns a prompt into successive lists of accepted token ids, one per forward pass."""
