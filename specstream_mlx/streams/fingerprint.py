"""What an adapter must match in its base model: the architecture and the tokenizer's
vocabulary. mlx-free: the PyTorch path (convert/) computes the same fingerprint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ARCH_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


def fingerprint(config: dict, vocab: dict[str, int]) -> dict:
    """The architecture fields of a model's config, and a hash of its vocabulary (~0.1 s for a
    49k vocabulary: compute it once per model)."""
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(ordered, ensure_ascii=False).encode()).hexdigest()[:16]
    return {**{k: config.get(k) for k in ARCH_KEYS}, "tokenizer_sha256": digest}


# A merged model folder's config.json field naming the LoRA folder merged into it and the sha256
# of its adapters.safetensors (scripts/fuse_next_token.py; checked by pack_lora_streams)
MERGED_LORA = "specstream_merged_lora"


def weights_sha256(folder) -> str:
    """The sha256 of an adapter folder's adapters.safetensors."""
    digest = hashlib.sha256()
    with open(Path(folder) / "adapters.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
