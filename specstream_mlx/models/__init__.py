"""Model loading: GGUF conversion, mlx-lm folders, and the adapter over mlx-lm architectures."""
