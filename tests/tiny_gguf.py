"""A tiny random llama saved as a GGUF file (float32 tensors, byte-level vocabulary), with
metadata that a test may change or drop to build broken files."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from .tiny import CHAT_TEMPLATE, SPECIALS

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
_BLOCK = {  # GGUF tensor name -> shape (out, in)
    "attn_q": (HIDDEN, HIDDEN),
    "attn_k": (HIDDEN * KV_HEADS // HEADS, HIDDEN),
    "attn_v": (HIDDEN * KV_HEADS // HEADS, HIDDEN),
    "attn_output": (HIDDEN, HIDDEN),
    "ffn_gate": (FFN, HIDDEN),
    "ffn_up": (FFN, HIDDEN),
    "ffn_down": (HIDDEN, FFN),
}


def _tokens() -> list[str]:
    from tokenizers import pre_tokenizers

    return SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt"]


def tiny_gguf_metadata() -> dict:
    tokens = _tokens()
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))  # 3: control
    return {
        "general.architecture": "llama",
        "llama.block_count": mx.array(LAYERS, dtype=mx.uint32),
        "llama.embedding_length": mx.array(HIDDEN, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(FFN, dtype=mx.uint32),
        "llama.attention.head_count": mx.array(HEADS, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(KV_HEADS, dtype=mx.uint32),
        "llama.context_length": mx.array(256, dtype=mx.uint32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def save_tiny_gguf(path: Path, **metadata) -> Path:
    """Write the tiny model to `path`; `metadata` replaces keys (dots as `__`), None drops one."""
    mx.random.seed(0)
    vocab = len(_tokens())
    weights = {
        "token_embd.weight": mx.random.normal((vocab, HIDDEN)) * 0.02,
        "output_norm.weight": mx.ones((HIDDEN,)),
    }
    for layer in range(LAYERS):
        for name, shape in _BLOCK.items():
            weights[f"blk.{layer}.{name}.weight"] = mx.random.normal(shape) * 0.02
        for name in ("attn_norm", "ffn_norm"):
            weights[f"blk.{layer}.{name}.weight"] = mx.ones((HIDDEN,))
    meta = tiny_gguf_metadata()
    for key, value in metadata.items():
        key = key.replace("__", ".")
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = mx.array(value, dtype=mx.uint32) if isinstance(value, int) else value
    mx.save_gguf(str(path), weights, meta)
    return path
