"""The tokenizer stored in GGUF metadata, rebuilt as a Hugging Face fast tokenizer.

Supports `tokenizer.ggml.model == "gpt2"` (byte-level BPE: vocabulary + merges). The
pre-tokenizer is named by `tokenizer.ggml.pre`; SmolLM2 ("smollm") splits every digit on its own
before the GPT-2 byte-level regex, and Qwen2 ("qwen2") splits with its own regex (single digits,
case-insensitive contractions) after NFC normalization, exactly as their Hugging Face
tokenizer.json files do.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import SpecstreamError

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types

_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
# Qwen2's tokenizer.json: split on this pattern, then map bytes without the GPT-2 regex.
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = pre_tokenizers.Sequence(
    [
        pre_tokenizers.Split(Regex(_QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ]
)
_NORMALIZERS = {"qwen2": normalizers.NFC()}
_PRE_TOKENIZERS = {
    "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _BYTE_LEVEL]),
    "qwen2": _QWEN2,
    "gpt2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
}


def _scalar(metadata: dict, key: str):
    value = metadata.get(key)
    return value.item() if hasattr(value, "item") else value


def gguf_tokens(metadata: dict) -> list[str]:
    """The vocabulary (tokenizer.ggml.tokens), which every GGUF model needs."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise SpecstreamError("GGUF metadata has no vocabulary (tokenizer.ggml.tokens)")
    return tokens


def gguf_tokenizer(metadata: dict):
    """A `transformers.PreTrainedTokenizerFast` equal to the one the GGUF was made from."""
    from transformers import PreTrainedTokenizerFast

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise SpecstreamError(
            f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)"
        )
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise SpecstreamError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(_PRE_TOKENIZERS)})"
        )
    tokens = gguf_tokens(metadata)
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise SpecstreamError("GGUF metadata has no BPE merges (tokenizer.ggml.merges)")
    merges = [tuple(m.split(" ", 1)) for m in merges]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    types = metadata.get("tokenizer.ggml.token_type")
    types = [int(t) for t in types] if types is not None else [1] * len(tokens)
    if len(types) != len(tokens):
        raise SpecstreamError(
            f"GGUF metadata has {len(types)} token types for {len(tokens)} tokens"
        )
    try:
        bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    except Exception as exc:  # tokenizers raises a bare Exception on a bad vocabulary or merge
        raise SpecstreamError(f"GGUF tokenizer is unusable: {exc}") from None

    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]
    if pre in _NORMALIZERS:
        tok.normalizer = _NORMALIZERS[pre]
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, t in enumerate(types) if t == _CONTROL]
    user = [tokens[i] for i, t in enumerate(types) if t == _USER_DEFINED]
    tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)

    def token_of(key: str):
        i = _scalar(metadata, key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token_of("tokenizer.ggml.bos_token_id"),
        eos_token=token_of("tokenizer.ggml.eos_token_id"),
        unk_token=token_of("tokenizer.ggml.unknown_token_id"),
        pad_token=token_of("tokenizer.ggml.padding_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
        model_max_length=_scalar(metadata, f"{metadata.get('general.architecture')}.context_length")
        or 2048,
    )
