"""Tiny random models of every supported family load from folders and decode correctly."""

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

import specstream_mlx as ss

from .tiny import FAMILIES


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request, tiny_folders):
    return ss.load(str(tiny_folders[request.param]))


def test_loads_in_float32_with_tokenizer(tiny):
    dtypes = {p.dtype for _, p in tree_flatten(tiny.model.parameters())}
    assert dtypes == {mx.float32}
    assert tiny.tokenizer.decode(tiny.tokenizer.encode("héllo wörld")) == "héllo wörld"
    assert tiny.eos_token_ids == {tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")}


def test_cached_logits_equal_uncached(tiny):
    ids = mx.array(tiny.tokenizer.encode("The quick brown fox jumps"))[None]
    full = tiny.model(ids)
    cache = make_prompt_cache(tiny.model)
    first = tiny.model(ids[:, :10], cache=cache)
    rest = [tiny.model(ids[:, i : i + 1], cache=cache) for i in range(10, ids.shape[1])]
    stepped = mx.concatenate([first] + rest, axis=1)
    assert mx.abs(full - stepped).max().item() <= 1e-4


def test_plain_greedy_equals_uncached_argmax(tiny):
    result = ss.generate(tiny, "Once upon a time", max_tokens=10)
    prompt = tiny.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Once upon a time"}], add_generation_prompt=True
    )
    ids = list(prompt)
    for _ in range(len(result.token_ids)):
        ids.append(mx.argmax(tiny.model(mx.array(ids)[None])[0, -1]).item())
    assert ids[len(prompt) :] == result.token_ids
    assert 1 <= len(result.token_ids) <= 10


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # its own head; tied to the embedding
@pytest.mark.parametrize("bits", [None, 4])
def test_head_columns_are_the_heads_weights_of_those_tokens(family, bits):
    """A draft vocabulary's head (decoding.tree_step.DraftVocab) reads the head's weights of
    its tokens off their rows; they give the same logits as the whole head, quantized or not."""
    import mlx.nn as nn

    from specstream_mlx.models.arch import arch_of

    from .tiny import make_tiny_model

    model, config = make_tiny_model(family, seed=3)
    if bits:
        nn.quantize(model, group_size=32, bits=bits)
    arch = arch_of(model, config["model_type"])
    ids = mx.array([5, 0, 200, 17, config["vocab_size"] - 1], dtype=mx.uint32)
    x = mx.random.normal((3, config["hidden_size"]), key=mx.random.key(1))
    whole = arch.lm_head(x)[:, ids]
    assert mx.allclose(x @ arch.head_columns(ids), whole, atol=1e-4, rtol=1e-4).item()
