"""specstream-mlx: Speculative Streaming (single-model speculative decoding) on Apple MLX.

Import this package before `mlx`: on Linux it first loads a system OpenBLAS for MLX's CPU backend
(see `backend.py`).
"""

import os

from .backend import preload_blas

# transformers (mlx-lm uses it for tokenizers) advises installing PyTorch on import: not needed.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
preload_blas()  # must run before mlx.core is imported anywhere below

from .errors import SpecstreamError  # noqa: E402
from .generate import (  # noqa: E402
    GenerationChunk,
    GenerationResult,
    GenerationStats,
    generate,
    stream_generate,
)
from .models.loader import DEFAULT_MODEL, LoadedModel, load_model  # noqa: E402
from .sampling import SamplingParams  # noqa: E402

__version__ = "0.1.0"


def load(
    model: str | None = None, adapter: str | None = None, precision: str = "auto"
) -> LoadedModel:
    """Load a model by name, path or hub id (None: the default SmolLM2-135M-Instruct), and
    optionally a stream adapter folder for the `ss` decoder."""
    loaded = load_model(model, precision=precision)
    if adapter is not None:
        from .streams.adapter_io import load_adapter

        loaded.streams = load_adapter(adapter, loaded)
        loaded.adapter = str(adapter)
    return loaded


__all__ = [
    "DEFAULT_MODEL",
    "GenerationChunk",
    "GenerationResult",
    "GenerationStats",
    "LoadedModel",
    "SamplingParams",
    "SpecstreamError",
    "generate",
    "load",
    "stream_generate",
]
