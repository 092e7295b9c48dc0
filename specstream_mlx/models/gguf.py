"""GGUF (llama.cpp) checkpoints -> mlx-lm model folders, for the llama and qwen2 architectures.

`mx.load` reads GGUF natively when every tensor is F32, F16, Q4_0, Q4_1 or Q8_0: the quantized ones
arrive as MLX affine-quantized triples (`weight` packed uint32, `scales`, `biases`, group size 32).
Other types (the K-quants Q4_K/Q5_K/Q6_K, Q5_0, ...) MLX refuses; such files are read with the
`gguf` package (llama.cpp's own Python reader) and every tensor dequantized to float32.
What is left to do here is naming, the config, the tokenizer, and undoing llama.cpp's Q/K row
permutation of llama models (GGUF stores their Q and K rows interleaved for "traditional" RoPE;
mlx-lm's llama uses the Hugging Face half-split layout; qwen2 files are not permuted). Row
permutations commute with per-row quantization, so the quantized tensors are permuted as is.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from tqdm import tqdm

from ..errors import SpecstreamError
from ..folders import staged_folder
from .gguf_meta import PlainReader, fields_of
from .gguf_tokenizer import gguf_tokenizer, gguf_tokens

GGUF_GROUP_SIZE = 32  # llama.cpp block size of Q4_0, Q4_1 and Q8_0

_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
ARCHITECTURES = {  # GGUF general.architecture -> (mlx-lm model_type, Hugging Face class)
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}
_IN_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def read_gguf(path: str | os.PathLike) -> tuple[dict[str, mx.array], dict]:
    """Load tensors and metadata, turning parse errors into one clear message."""
    path = Path(path)
    if not path.is_file():
        raise SpecstreamError(f"GGUF file not found: {path}")
    try:
        return mx.load(str(path), return_metadata=True)
    except Exception as exc:  # mlx raises RuntimeError/ValueError with C++ messages
        refused = exc
    try:  # K-quants and other types MLX does not read
        return _read_dequantized(path)
    except Exception as exc:
        size = path.stat().st_size
        raise SpecstreamError(
            f"cannot read GGUF file {path} ({size} bytes): corrupt or truncated ({refused}; {exc})"
        ) from None


SOURCE_QUANT = "specstream.source_quantization"  # metadata key _read_dequantized adds


def _read_dequantized(path: Path) -> tuple[dict[str, mx.array], dict]:
    """Every tensor as float32 and the metadata in mx.load's form, through the `gguf` package;
    the metadata gains SOURCE_QUANT, the file's most common quantized tensor type (Q4_K, ...),
    so that a device which keeps weights quantized can re-quantize to a similar size."""
    reader = PlainReader(path)
    quantized = Counter(
        t.tensor_type.name for t in reader.tensors if t.tensor_type.name not in UNQUANTIZED
    )
    metadata = {SOURCE_QUANT: quantized.most_common(1)[0][0]} if quantized else {}
    for key, value in fields_of(reader).items():
        if isinstance(value, list) and value and not isinstance(value[0], str):
            value = mx.array(value)
        metadata[key] = value
    bar = tqdm(  # on a terminal only: a first conversion takes tens of seconds
        total=len(reader.tensors),
        desc=f"dequantizing {path.name}",
        unit="tensor",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        leave=False,
    )
    weights = {}
    with bar, ThreadPoolExecutor(os.cpu_count()) as pool:  # numpy releases the GIL
        for t, a in zip(reader.tensors, pool.map(_dequantized, reader.tensors), strict=True):
            weights[t.name] = mx.array(a)
            bar.update()
    return weights, metadata


UNQUANTIZED = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")


def _dequantized(tensor):
    """One GGUF tensor as a float32 numpy array, shaped (rows, columns) like Hugging Face's."""
    data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest axis first
    return np.ascontiguousarray(data, dtype=np.float32).reshape(shape)


def _scalar(metadata: dict, key: str, default=None):
    value = metadata.get(key, default)
    if isinstance(value, mx.array):
        value = value.item()
    return value


def _unpermute_rows(w: mx.array, n_head: int) -> mx.array:
    """Inverse of llama.cpp's `permute`: (n_head, 2, half, ...) -> (n_head, half, 2, ...)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise SpecstreamError(
            f"GGUF Q/K tensor with {rows} rows does not split into {n_head} heads (head_count "
            "in the metadata does not fit the tensors)"
        )
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_blocks(weights: dict[str, mx.array], n_layers: int) -> None:
    """The file's blocks (blk.N.*) must be blocks 0..n_layers-1 of the metadata's block_count."""
    found = set()
    for name in weights:
        parts = name.split(".")
        if parts[0] == "blk":
            if len(parts) < 3 or not parts[1].isdigit():
                raise SpecstreamError(f"unsupported GGUF tensor {name!r}")
            found.add(int(parts[1]))
    if found != set(range(n_layers)):
        have = f"blocks {min(found)}-{max(found)} ({len(found)})" if found else "no blocks"
        raise SpecstreamError(
            f"GGUF metadata says block_count {n_layers}, the file has tensors for {have}"
        )


def _rename(name: str) -> str:
    stem, _, suffix = name.rpartition(".")  # suffix: weight | scales | biases | bias
    if stem in _TOP_LEVEL:
        return f"{_TOP_LEVEL[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _IN_BLOCK:
        return f"model.layers.{parts[1]}.{_IN_BLOCK[parts[2]]}.{suffix}"
    raise SpecstreamError(f"unsupported GGUF tensor {name!r}")


def _count(metadata: dict, key: str, default=None) -> int:
    """A positive integer from the metadata; a missing or malformed one is a SpecstreamError."""
    value = _scalar(metadata, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecstreamError(f"GGUF metadata {key} must be a positive integer, got {value!r}")
    return value


def _shape_config(metadata: dict, arch: str) -> dict:
    """The {arch}.* sizes, checked against each other (heads divide the width, KV heads the
    heads)."""
    n_heads = _count(metadata, f"{arch}.attention.head_count")
    n_kv = _count(metadata, f"{arch}.attention.head_count_kv", n_heads)
    hidden = _count(metadata, f"{arch}.embedding_length")
    if hidden % n_heads or n_heads % n_kv:
        raise SpecstreamError(
            f"GGUF metadata does not fit together: embedding_length {hidden}, head_count "
            f"{n_heads}, head_count_kv {n_kv} (heads must divide the width, KV heads the heads)"
        )
    return {
        "hidden_size": hidden,
        "num_hidden_layers": _count(metadata, f"{arch}.block_count"),
        "intermediate_size": _count(metadata, f"{arch}.feed_forward_length"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": _count(metadata, f"{arch}.rope.dimension_count", hidden // n_heads),
        "max_position_embeddings": _count(metadata, f"{arch}.context_length", 2048),
    }


def gguf_config(metadata: dict) -> dict:
    """The mlx-lm / Hugging Face `config.json` of a llama- or qwen2-architecture GGUF."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise SpecstreamError(
            f"GGUF architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)}); "
            "use a Hugging Face or mlx-lm model folder instead"
        )
    try:
        eps = float(_scalar(metadata, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        theta = float(_scalar(metadata, f"{arch}.rope.freq_base", 10000.0))
    except (TypeError, ValueError) as exc:
        raise SpecstreamError(
            f"GGUF metadata: unreadable rms epsilon or rope base ({exc})"
        ) from None
    model_type, hf_class = ARCHITECTURES[arch]
    return {
        "model_type": model_type,
        "architectures": [hf_class],
        **_shape_config(metadata, arch),
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "vocab_size": len(gguf_tokens(metadata)),
        "bos_token_id": _scalar(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _scalar(metadata, "tokenizer.ggml.eos_token_id"),
    }


def gguf_weights(weights: dict[str, mx.array], config: dict) -> tuple[dict[str, mx.array], dict]:
    """Rename to mlx-lm names, undo the Q/K permutation; returns (weights, quantization config)."""
    _check_blocks(weights, config["num_hidden_layers"])
    out = {}
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    permuted = config["model_type"] == "llama"
    for name, w in weights.items():
        kind = name.split(".")[-2]
        out[_rename(name)] = _unpermute_rows(w, heads[kind]) if permuted and kind in heads else w
    config["tie_word_embeddings"] = "lm_head.weight" not in out

    # Bits per quantized module, read off the packed shapes: (out, in*bits/32) vs (out, in/group).
    bits = {}
    for name, scales in out.items():
        if name.endswith(".scales"):
            module = name[: -len(".scales")]
            in_dim = scales.shape[-1] * GGUF_GROUP_SIZE
            bits[module] = out[f"{module}.weight"].shape[-1] * 32 // in_dim
    if not bits:
        return out, {}
    common = Counter(bits.values()).most_common(1)[0][0]
    quant = {"group_size": GGUF_GROUP_SIZE, "bits": common}
    for module, b in sorted(bits.items()):
        if b != common:
            quant[module] = {"group_size": GGUF_GROUP_SIZE, "bits": b}
    return out, quant


def write_model_folder(
    out_dir: str | os.PathLike,
    config: dict,
    weights: dict[str, mx.array],
    tokenizer,
    overwrite: bool = False,
) -> Path:
    """Write an mlx-lm-loadable folder atomically: built beside the target, then renamed."""
    out_dir = Path(out_dir)
    with staged_folder(out_dir, overwrite) as tmp:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tokenizer.save_pretrained(str(tmp))
    return out_dir


def dequantize_weights(weights: dict[str, mx.array], quant: dict, dtype) -> dict[str, mx.array]:
    """Replace every (weight, scales, biases) triple by a plain `dtype` weight."""
    out = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")) and name.rsplit(".", 1)[0] + ".weight" in weights:
            continue
        module = name.rsplit(".", 1)[0]
        if f"{module}.scales" in weights:
            bits = quant.get(module, quant)["bits"]
            scales, biases = (
                weights[f"{module}.{k}"].astype(mx.float32) for k in ("scales", "biases")
            )
            w = mx.dequantize(w, scales, biases, GGUF_GROUP_SIZE, bits)  # in float32, as llama.cpp
        out[name] = w.astype(dtype) if mx.issubdtype(w.dtype, mx.floating) else w
    return out


def convert_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    dtype: str = "stored",
) -> Path:
    """Convert a llama- or qwen2-architecture GGUF to an mlx-lm folder.

    dtype "stored" keeps the tensors MLX reads natively as they are (K-quants arrive dequantized
    to float32); "float32", "float16" or "bfloat16" dequantizes every quantized tensor.
    """

    weights, metadata = read_gguf(gguf_path)
    config = gguf_config(metadata)
    weights, quant = gguf_weights(weights, config)
    if dtype != "stored":
        weights = dequantize_weights(weights, quant, getattr(mx, dtype))
        config["torch_dtype"] = dtype
    elif quant:
        config["quantization"] = quant
        config["quantization_config"] = quant
    if SOURCE_QUANT in metadata:  # dequantized on reading: loader.auto_precision reads it
        config["specstream_source_quantization"] = metadata[SOURCE_QUANT]
    tokenizer = gguf_tokenizer(metadata)
    return write_model_folder(out_dir, config, weights, tokenizer, overwrite=overwrite)
