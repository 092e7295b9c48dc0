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


# A tiny qwen2 in the tensor types of a real Q4_K_M file: Q4_K, Q6_K, Q5_0, Q8_0 and F32.
# K-quant rows hold 256 values, so the widths here are multiples of 256.
Q_HIDDEN, Q_FFN, Q_HEADS, Q_KV_HEADS = 256, 512, 4, 2
Q_KV = Q_HIDDEN * Q_KV_HEADS // Q_HEADS


def _k_quant_bytes(rng, rows: int, cols: int, qtype):
    """Random K-quant blocks whose float16 scales are small and finite (any other byte is a
    valid quant)."""
    import gguf
    import numpy as np

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.full((rows, cols // block, 1), 0.001, dtype=np.float16).view(np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:  # d, dmin first
        data[..., 0:2] = scale
        data[..., 2:4] = scale
    else:  # Q6_K: d last
        data[..., size - 2 :] = scale
    return data.reshape(rows, -1)


def save_tiny_qwen2_gguf(path: Path) -> Path:
    """A tiny random qwen2 GGUF (biases on q/k/v, untied output) in K-quant and legacy types."""
    import gguf
    import numpy as np

    q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    tokens = _tokens()
    writer = gguf.GGUFWriter(str(path), "qwen2")
    for key, value in {
        "block_count": LAYERS,
        "context_length": 256,
        "embedding_length": Q_HIDDEN,
        "feed_forward_length": Q_FFN,
        "attention.head_count": Q_HEADS,
        "attention.head_count_kv": Q_KV_HEADS,
    }.items():
        writer.add_uint32(f"qwen2.{key}", value)
    writer.add_float32("qwen2.rope.freq_base", 1000000.0)
    writer.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["Ġ t"])
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def legacy(name, qtype, *shape):
        writer.add_tensor(name, gguf.quants.quantize(normal(*shape), qtype), raw_dtype=qtype)

    def k_quant(name, qtype, rows, cols):
        writer.add_tensor(name, _k_quant_bytes(rng, rows, cols, qtype), raw_dtype=qtype)

    legacy("token_embd.weight", q.Q5_0, len(tokens), Q_HIDDEN)
    legacy("output.weight", q.Q8_0, len(tokens), Q_HIDDEN)
    writer.add_tensor("output_norm.weight", 1 + normal(Q_HIDDEN))
    for i in range(LAYERS):
        blk = f"blk.{i}"
        k_quant(f"{blk}.attn_q.weight", q.Q4_K, Q_HIDDEN, Q_HIDDEN)
        legacy(f"{blk}.attn_k.weight", q.Q5_0, Q_KV, Q_HIDDEN)
        legacy(f"{blk}.attn_v.weight", q.Q8_0, Q_KV, Q_HIDDEN)
        k_quant(f"{blk}.attn_output.weight", q.Q6_K, Q_HIDDEN, Q_HIDDEN)
        for name, rows in (("attn_q", Q_HIDDEN), ("attn_k", Q_KV), ("attn_v", Q_KV)):
            writer.add_tensor(f"{blk}.{name}.bias", normal(rows))
        k_quant(f"{blk}.ffn_gate.weight", q.Q4_K, Q_FFN, Q_HIDDEN)
        k_quant(f"{blk}.ffn_up.weight", q.Q4_K, Q_FFN, Q_HIDDEN)
        k_quant(f"{blk}.ffn_down.weight", q.Q6_K, Q_HIDDEN, Q_FFN)
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"{blk}.{name}.weight", 1 + normal(Q_HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
