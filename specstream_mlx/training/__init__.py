"""Training stream adapters (paper Section 2.4): data, the multi-stream loss, the training loop."""
