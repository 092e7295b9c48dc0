"""Tiny random models of every supported family, saved as real mlx-lm folders with a tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}"
)
VOCAB = 256 + len(SPECIALS)  # byte-level tokenizer without merges

_BASE = dict(
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB,
    rope_theta=10000.0,
    max_position_embeddings=256,
    pad_token_id=0,
    eos_token_id=SPECIALS.index("<|im_end|>") + 256,
)
FAMILIES = {
    "llama": dict(_BASE, model_type="llama", tie_word_embeddings=False),
    "mistral": dict(_BASE, model_type="mistral", tie_word_embeddings=False),
    "qwen2": dict(_BASE, model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(_BASE, model_type="qwen3", head_dim=16, tie_word_embeddings=True),
    "phi3": dict(_BASE, model_type="phi3", tie_word_embeddings=False, num_key_value_heads=4),
}


def byte_tokenizer():
    """A real byte-level BPE tokenizer (no merges) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_order = sorted(alphabet)
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(byte_order)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def make_tiny_model(family: str, seed: int = 0, **overrides):
    config = dict(FAMILIES[family], **overrides)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model, config


def save_tiny_model(folder: Path, family: str, seed: int = 0, **overrides) -> Path:
    model, config = make_tiny_model(family, seed, **overrides)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    byte_tokenizer().save_pretrained(str(folder))
    return folder


def draft_vocab(loaded, seed: int) -> tuple[int, ...]:
    """A random third of the model's vocabulary, as an adapter's draft vocabulary."""
    vocab = loaded.config["vocab_size"]
    picked = mx.random.permutation(vocab, key=mx.random.key(seed))[: vocab // 3]
    return tuple(sorted(int(t) for t in picked.tolist()))
