"""specstream-mlx: Speculative Streaming (single-model speculative decoding) on Apple MLX.

Import this package before `mlx`: on Linux it first loads a system OpenBLAS for MLX's CPU backend
(see `backend.py`). On a machine without MLX (the PyTorch path, convert/, on a CUDA host) the
package still imports, and its mlx-free modules (stream config, tree construction, prompt lookup,
training data) are shared with that path; the names below need MLX.
"""

import os

from .backend import preload_blas
from .errors import SpecstreamError

# transformers (mlx-lm uses it for tokenizers) advises installing PyTorch on import: not needed.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
preload_blas()  # must run before mlx.core is imported anywhere

__version__ = "0.1.0"

try:
    from .generate import (
        GenerationChunk,
        GenerationResult,
        GenerationStats,
        generate,
        stream_generate,
    )
    from .models.loader import DEFAULT_MODEL, LoadedModel, load_model
    from .sampling import SamplingParams
except ModuleNotFoundError as exc:  # no MLX here: only the mlx-free modules can be used
    if (exc.name or "").split(".")[0] not in ("mlx", "mlx_lm"):
        raise


def load(model: str | None = None, adapter: str | None = None, precision: str = "auto"):
    """Load a model by name, path or hub id (None: the default SmolLM2-135M-Instruct), and
    optionally a stream adapter folder for the `ss` decoder. Returns a LoadedModel."""
    loaded = load_model(model, precision=precision)
    if adapter is not None:
        use_adapter(loaded, adapter)
    return loaded


def use_adapter(loaded, adapter: str) -> None:
    """Make the stream adapter `adapter` (a folder or a shipped name) the one `loaded` uses."""
    from .streams.adapter_io import load_adapter

    loaded.streams = load_adapter(adapter, loaded)
    loaded.adapter = str(adapter)


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
