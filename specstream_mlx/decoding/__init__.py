"""Decoders: each turns a prompt into lists of accepted token ids, one list per forward pass."""
