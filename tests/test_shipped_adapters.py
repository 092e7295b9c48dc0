"""The adapters shipped inside the package load on the default model and keep the exactness
invariant: Speculative Streaming gives the tokens of the (adapted) model's own plain decoding."""

import json

import mlx.core as mx
import pytest

import specstream_mlx as ss
from specstream_mlx.streams.adapter_io import SHIPPED_DIR, shipped_adapters
from specstream_mlx.tasks import get_task
from specstream_mlx.training.licences import licences

PROMPTS = {
    "chat": ["Explain how rainbows form.", "Write a haiku about the moon."],
    "sql": [
        get_task("sql").prompt(
            context="CREATE TABLE head (age INTEGER, name VARCHAR)",
            question="How many heads of the departments are older than 56?",
        )
    ],
    "data2text": [
        get_task("data2text").prompt(
            mr="name[The Eagle], eatType[coffee shop], food[French], area[riverside]"
        )
    ],
    "summarize": [
        get_task("summarize").prompt(
            dialogue="#Person1#: Are you coming to the meeting at three?\n"
            "#Person2#: Yes, but I will be ten minutes late. Please start without me."
        )
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", shipped_adapters())
def test_shipped_adapter_decodes_exactly(name):
    loaded = ss.load(adapter=name)
    assert loaded.streams.config.gamma >= 1
    for prompt in PROMPTS.get(name, PROMPTS["chat"]):
        plain = ss.generate(loaded, prompt, max_tokens=24)
        spec = ss.generate(loaded, prompt, max_tokens=24, decoder="ss")
        assert spec.token_ids == plain.token_ids
        assert spec.stats.forward_passes <= plain.stats.forward_passes


@pytest.mark.slow
def test_a_shipped_writing_tool_distills_its_own_answers_batched(tmp_path):
    """The shipped writing tools' main streams ignore their streams, so `distill` decodes their
    answers with mlx-lm's batch generator, from the model their LoRA is on: each row is the
    tool's own plain decoding, not the base model's."""
    from specstream_mlx.training.distill import distill
    from specstream_mlx.training.instructions import Instruction

    tool, base = ss.load(adapter="sql"), ss.load()
    assert not tool.streams.config.main_needs_streams
    sql = get_task("sql")
    questions = ["How many heads are older than 56?", "List the names of heads named Smith."]
    context = "CREATE TABLE head (age INTEGER, name VARCHAR)"
    prompts = [sql.prompt(context=context, question=q) for q in questions]
    out = tmp_path / "own.jsonl"
    # batch size 1: mlx-lm's batch generator, one row at a time (a padded batch's arithmetic may
    # break a near-tie differently from one row's, and this compares tokens exactly)
    distill(tool, [Instruction(p, "sql", "sql") for p in prompts], out, 24, 1, log=print)
    rows = {row["prompt"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == sorted(prompts)  # rows land in the order answers end: compare as sets
    answers = {}
    for who, model in (("tool", tool), ("base", base)):
        ids = [ss.generate(model, p, max_tokens=24).token_ids for p in prompts]
        answers[who] = [model.tokenizer.decode(a) for a in ids]
    assert [rows[p]["completion"] for p in prompts] == answers["tool"] != answers["base"]


def test_the_four_adapters_ship():
    """Issue 4: the general chat adapter (lossless) and the three writing tools (shared)."""
    assert shipped_adapters() == ["chat", "data2text", "sql", "summarize"]
    configs = {
        n: json.loads((SHIPPED_DIR / n / "adapter_config.json").read_text())
        for n in shipped_adapters()
    }
    modes = {n: c["stream_config"]["mode"] for n, c in configs.items()}
    assert modes == {
        "chat": "lossless",
        "data2text": "shared",
        "sql": "shared",
        "summarize": "shared",
    }


@pytest.mark.parametrize("name", shipped_adapters())
def test_shipped_adapter_extra_parameters_within_budget(name):
    """Issue 4 set 1e5 extra parameters per adapter besides its LoRA layers; issue 20 allows up
    to 1e6 where the capacity pays (chat's 16 MSA layers: 158,976, 12 layers gave stream 1 0.39
    against 8 layers' 0.25; its parent heads of rank 112: 774,144, stream 2 after a right
    stream 1 from 0.32 to 0.47)."""
    weights = mx.load(str(SHIPPED_DIR / name / "adapters.safetensors"))
    extra = sum(w.size for k, w in weights.items() if not k.startswith("lora."))
    assert 0 < extra <= 1_000_000


def _data_records(node):
    """Every training-data record in an adapter config, nested ones (streams_from, continues)
    included."""
    if isinstance(node, dict):
        if "path" in node and "examples" in node:
            yield node
        for value in node.values():
            yield from _data_records(value)
    elif isinstance(node, list):
        for value in node:
            yield from _data_records(value)


@pytest.mark.parametrize("name", ["chat", "data2text", "sql", "summarize", "qwen-chat", "qwen-sql"])
def test_shipped_adapter_names_its_training_data_and_licences(name):
    """Attribution travels with what is trained on the data: each training step's record in a
    shipped adapter's config names its sources and their licences, none of unknown terms."""
    folder = SHIPPED_DIR / name.replace("qwen-", "qwen2.5-coder-0.5b-instruct/")
    config = json.loads((folder / "adapter_config.json").read_text())
    records = list(_data_records(config["training"]))
    assert records
    for record in records:
        assert record["licences"] == licences(record["sources"])
        assert sum(record["licences"].values()) > 0
        assert not any(lic.startswith("unknown") for lic in record["licences"])
