"""The distilled corpus: the instructions' fixed dev slice, the loop filter, resumable distill."""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

import specstream_mlx as ss
from specstream_mlx.training.data import load_dataset
from specstream_mlx.training.degenerate import find_loop, is_degenerate
from specstream_mlx.training.distill import distill, make_row
from specstream_mlx.training.instructions import (
    DEV_FRACTION,
    FILE,
    Instruction,
    instructions_split,
    is_dev,
    read_instructions,
)

from .conftest import real_data_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tiny_folders):
    return ss.load(str(tiny_folders["llama"]))


def test_dev_slice_is_fixed_by_the_prompt_text_alone(tmp_path):
    rows = [{"prompt": f"question number {i}?", "source": "s", "category": "c"} for i in range(400)]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dev = {r.prompt for r in instructions_split(path, "dev")}
    assert all(is_dev(p) for p in dev)
    # the file grows and is reordered: the old prompts keep their side
    more = rows[::-1] + [{"prompt": f"another one {i}"} for i in range(400)]
    path.write_text("".join(json.dumps(r) + "\n" for r in more))
    grown_dev = {r.prompt for r in instructions_split(path, "dev")}
    assert grown_dev & {r["prompt"] for r in rows} == dev
    train = {r.prompt for r in instructions_split(path, "train")}
    assert not train & grown_dev and len(train) + len(grown_dev) == 800
    assert 0 < len(grown_dev) < 0.1 * 800


def test_the_instructions_file_splits_into_train_and_dev(data):
    path = data / FILE
    everything = read_instructions(path)
    dev, train = instructions_split(path, "dev"), instructions_split(path, "train")
    assert dev and len(dev) + len(train) == len(everything)
    assert not {r.prompt for r in dev} & {r.prompt for r in train}
    assert all(r.prompt.strip() and r.category for r in everything)
    assert all("@" in r.source for r in everything)  # <owner/repo>@<commit>: the attribution
    assert len(dev) < 3 * DEV_FRACTION * len(everything) + 5


def test_every_category_gets_its_share_of_the_dev_slice(tmp_path):
    categories = ("coding", "maths", "role play")
    rows = [{"prompt": f"{c} prompt {i}", "category": c} for c in categories for i in range(2000)]
    path = tmp_path / "i.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    per_category = Counter(r.category for r in instructions_split(path, "dev"))
    for category in categories:  # about DEV_FRACTION of its 2,000
        assert 0.5 * DEV_FRACTION * 2000 < per_category[category] < 1.5 * DEV_FRACTION * 2000


def test_the_real_dev_slice_has_hundreds_of_prompts_from_every_category():
    """Figures of the real file: only it has them."""
    path = real_data_file(FILE)
    everything, dev = read_instructions(path), instructions_split(path, "dev")
    assert len(dev) >= 300
    per_category, dev_per_category = (
        Counter(r.category for r in rows) for rows in (everything, dev)
    )
    for category, n in per_category.items():  # a share of every category, about DEV_FRACTION
        assert 0 < dev_per_category[category] < 3 * DEV_FRACTION * n + 5, category


LOOPS = [
    "The free energy principle is related to " + "-X" * 120,
    "I like cats. " * 20,
    "Sure! " + "The answer is yes, it is. The answer is no, it is not. " * 8,
    "Step 1: open the box.\n"
    + "".join(f"Step {i}: open the box and look inside.\n" for i in range(9)),
    "1. Apple\n2. Banana\n" + "3. Cherry\n" * 12,
]
NOT_LOOPS = [
    "The sky looks blue because air molecules scatter short wavelengths of sunlight more than "
    "long ones (Rayleigh scattering), so blue light reaches our eyes from every direction.",
    "def f(xs):\n        total = 0\n        for x in xs:\n            if x > 0:\n"
    "                total += x\n        return total\n",
    "1. Apple\n2. Banana\n3. Cherry\n4. Dates\n5. Elderberry\n6. Fig\n7. Grape\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\nThe table lists two rows of numbers.",
    "Yes. Yes. Yes.",
    "",
]


@pytest.mark.parametrize("text", LOOPS)
def test_answers_that_loop_are_degenerate(text):
    assert is_degenerate(text), find_loop(text)


@pytest.mark.parametrize("text", NOT_LOOPS)
def test_ordinary_answers_are_not_degenerate(text):
    assert not is_degenerate(text), find_loop(text)


class _Letters:
    """A tokenizer stand-in: token i decodes to letter i."""

    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


def test_rows_record_attribution_the_cap_and_the_loop_flag():
    item = Instruction("p", "owner/repo@abc", "coding")
    row = make_row(_Letters(), item, [23, 1] * 40, capped=True)  # "xbxbxb..."
    assert row["degenerate"] and row["capped"] and row["tokens"] == 80
    assert (row["source"], row["category"], row["prompt"]) == ("owner/repo@abc", "coding", "p")
    assert not make_row(_Letters(), item, [0, 1, 2], capped=False)["degenerate"]


def test_distill_resumes_repairs_a_cut_line_and_never_drops_rows(tiny, tmp_path):
    out = tmp_path / "d.jsonl"
    prompts = [Instruction(f"count from {i}", "src@1", "cat") for i in range(7)]
    stats = distill(tiny, prompts[:4], out, max_tokens=6, batch_size=2, log=lambda s: None)
    assert stats.rows == 4 and stats.tokens <= 24
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert {r["prompt"] for r in rows} == {p.prompt for p in prompts[:4]}
    assert all(r["source"] == "src@1" and r["tokens"] <= 6 for r in rows)
    with open(out, "a") as f:
        f.write('{"prompt": "count from 5", "compl')  # a write cut by a crash
    seen = []
    distill(tiny, prompts + prompts[:2], out, 6, 3, log=lambda s: None, on_row=seen.append)
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert sorted(r["prompt"] for r in rows) == sorted(p.prompt for p in prompts)
    assert len(seen) == 3 and seen[-1].rows == 3
    with open(out, "a") as f:  # a malformed complete line: an error, the file left as it is
        f.write("not json\n")
    before = out.read_bytes()
    with pytest.raises(ss.SpecstreamError, match="malformed"):
        distill(tiny, prompts, out, 6, 3, log=lambda s: None)
    assert out.read_bytes() == before


def test_distill_with_a_shared_adapter_writes_the_tools_own_answers(tiny_folders, tmp_path):
    """A shared-mode adapter whose main stream attends to its streams, which batched decoding
    does not run: its rows are its own greedy answers (one at a time), not the base model's."""
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.params import StreamParams

    tool = ss.load(str(tiny_folders["llama"]))
    cfg = StreamConfig(gamma=2, n_msa_layers=2, mode="shared").validate(
        tool.config["num_hidden_layers"]
    )
    tool.streams = StreamParams(cfg, tool.config["hidden_size"]).randomize(3)
    base = ss.load(str(tiny_folders["llama"]))
    prompts = [Instruction(f"summarize note {i}", "notes t.jsonl", "summarize") for i in range(4)]
    out, base_out = tmp_path / "tool.jsonl", tmp_path / "base.jsonl"
    distill(tool, prompts, out, max_tokens=8, batch_size=2, log=lambda s: None)
    distill(base, prompts, base_out, max_tokens=8, batch_size=2, log=lambda s: None)
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    base_rows = [json.loads(ln) for ln in base_out.read_text().splitlines()]
    for row in rows:
        plain = ss.generate(tool, row["prompt"], max_tokens=8, decoder="ar")
        assert row["completion"] == tool.tokenizer.decode(plain.token_ids)
        assert row["tokens"] == len(plain.token_ids) and row["category"] == "summarize"
    assert [r["prompt"] for r in rows] == [p.prompt for p in prompts]
    assert [r["completion"] for r in rows] != [r["completion"] for r in base_rows]


def test_distill_cli_task_prompts_are_the_tools_in_a_seeded_order(tmp_path):
    from specstream_apps.cli import build_parser
    from specstream_apps.distill_cmd import source_prompts

    from specstream_mlx.tasks import get_task

    rows = [{"id": str(i), "dialogue": f"A: hi {i}\nB: bye", "summary": "s"} for i in range(30)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["distill", "--task", "summarize", "--data-file", str(path), "--out", "o.jsonl"]
    items = source_prompts(build_parser().parse_args(argv + ["--limit", "5"]))
    every = source_prompts(build_parser().parse_args(argv))
    again = source_prompts(build_parser().parse_args(argv + ["--seed", "1"]))
    task = get_task("summarize")
    assert sorted(it.prompt for it in every) == sorted(task.prompt(**r) for r in rows)
    assert items == every[:5] and every != again
    assert all(it.source == "dialogsum train.jsonl" and it.category == "summarize" for it in every)
    with pytest.raises(ss.SpecstreamError, match="--data-file"):
        source_prompts(build_parser().parse_args(argv[:3] + ["--out", "o.jsonl"]))


def test_training_reader_skips_degenerate_rows(tiny, tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"prompt": "a", "completion": "fine answer", "source": "x@1", "degenerate": False},
        {"prompt": "b", "completion": "-X" * 30, "source": "x@1", "degenerate": True},
        {"prompt": "c", "completion": "another answer", "source": "y@2"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_dataset(path, tiny.tokenizer)
    assert len(data) == 2 and data.summary["skipped_degenerate"] == 1
    assert data.summary["sources"] == {"x@1": 1, "y@2": 1}
    assert data.summary["licences"] == {"unknown: see the source's own terms": 2}


def test_licences_name_every_source_a_task_or_the_chat_mix_gives():
    """Each writing task's data set and each chat-mix kind has a licence, so an adapter's config
    says under which terms its training text came."""
    from specstream_mlx.tasks import TASKS
    from specstream_mlx.training.chat_prompts import MIX_SOURCES
    from specstream_mlx.training.licences import licence_of, licences

    assert all(licence_of(t.source("train.jsonl")) for t in TASKS.values())
    assert all(licence_of(s) for s in MIX_SOURCES.values())
    assert licence_of("dialogsum train.jsonl") == "CC BY-NC-SA 4.0 (DialogSum)"
    # only the forms the project writes: a user's source never borrows a data set's terms
    for other in ("someone/else@123", "my sql notes", "sql notes", "e2e", "specstream-mlx x"):
        assert licence_of(other) is None, other
    counts = licences({"teknium1/GPTeacher@4810751": 3, "openai/grade-school-math@3101c7d": 2})
    assert counts == {"MIT (GPTeacher; GPT-4-generated)": 3, "MIT (GSM8K)": 2}


def test_licences_name_every_source_of_the_real_instructions():
    from specstream_mlx.training.licences import licence_of

    seen = {r.source for r in read_instructions(real_data_file("instructions/instructions.jsonl"))}
    assert len(seen) == 6 and all(licence_of(s) for s in seen), seen


def test_distill_cli_reads_a_split_of_the_instructions(tmp_path):
    from specstream_apps.cli import build_parser
    from specstream_apps.distill_cmd import source_prompts

    rows = [
        {"prompt": f"question {i}?", "source": f"r@{i % 2}", "category": "c"} for i in range(300)
    ]
    path = tmp_path / "i.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["distill", "--instructions", str(path), "--out", "o.jsonl"]
    args = build_parser().parse_args(argv + ["--split", "dev", "--limit", "3"])
    dev = source_prompts(args)
    assert len(dev) == 3 and all(is_dev(it.prompt) and it.source for it in dev)
    train = source_prompts(build_parser().parse_args(argv))
    assert len(train) == 300 - len(instructions_split(path, "dev"))


def test_distill_cli_chat_prompts_leave_out_non_commercial_dialogues(data):
    """`specstream distill --chat-prompts N` answers the chat mix's prompts, each naming its data
    set and licence, without DialogSum's non-commercial dialogues unless --mix-kinds asks."""
    from specstream_apps.cli import build_parser
    from specstream_apps.distill_cmd import source_prompts

    from specstream_mlx.training.chat_prompts import MIX_SOURCES

    argv = ["distill", "--chat-prompts", "20", "--data-dir", str(data), "--out", "o.jsonl"]
    default = source_prompts(build_parser().parse_args(argv))
    every = source_prompts(build_parser().parse_args(argv + ["--mix-kinds", "all"]))
    assert {it.category for it in every} == set(MIX_SOURCES)
    assert [it for it in every if it.category != "dialogue"] == default
    assert all(it.source == MIX_SOURCES[it.category] for it in every)
    only = source_prompts(build_parser().parse_args(argv + ["--mix-kinds", "sql,passage"]))
    assert {it.category for it in only} == {"sql", "passage"}
    with pytest.raises(ss.SpecstreamError, match="--mix-kinds"):
        source_prompts(build_parser().parse_args(argv + ["--mix-kinds", "dialogues"]))


def _distilled_rows(prompts):
    rows = [
        make_row(_Letters(), Instruction(p, f"r@{i % 2}", "c"), [i % 20, 3, 4], capped=i % 2 == 0)
        for i, p in enumerate(prompts)
    ]
    for row in rows[::3]:  # answers that copy their prompt, as real ones often do
        row["completion"] = f"Sure. {row['prompt']} -- {row['completion']} {row['prompt'][-20:]}"
    return rows


def test_the_corpus_keeps_answers_without_prompts_and_rebuilds_the_rows(tmp_path):
    from specstream_mlx.training.corpus import pack, read_shards, shards, unpack
    from specstream_mlx.training.instructions import read_instructions

    prompts = [f"Tell me about topic {i}." for i in range(9)]
    instructions = tmp_path / "instructions.jsonl"
    instructions.write_text(
        "".join(
            json.dumps({"prompt": p, "source": f"r@{i % 2}", "category": "c"}) + "\n"
            for i, p in enumerate(prompts)
        )
    )
    rows = _distilled_rows(prompts)
    distilled, corpus = tmp_path / "d.jsonl", tmp_path / "corpus"
    distilled.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    first = pack(distilled, corpus, "train")
    assert first.name == "train-00001.jsonl.gz"
    stored = gzip.decompress(first.read_bytes()).decode()
    # no prompt text, not even what an answer copies from its prompt (16 characters or more)
    assert not any(p[i : i + 16] in stored for p in prompts for i in range(len(p) - 15))
    assert pack(distilled, corpus, "train") is None  # nothing new: no shard
    distilled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert pack(distilled, corpus, "train").name == "train-00002.jsonl.gz"
    assert [s.name for s in shards(corpus, "train")] == [
        "train-00001.jsonl.gz",
        "train-00002.jsonl.gz",
    ]
    assert len(read_shards(corpus, "train")) == 9 and shards(corpus, "dev") == []

    # a new machine: the shards and the instructions file rebuild every row as distill wrote it
    rebuilt = tmp_path / "new" / "d.jsonl"
    items = read_instructions(instructions)
    assert unpack(corpus, items, "train", rebuilt) == 9
    got = sorted(
        (json.loads(ln) for ln in rebuilt.read_text().splitlines()), key=lambda r: r["prompt"]
    )
    assert got == sorted(rows, key=lambda r: r["prompt"])
    assert unpack(corpus, items, "train", rebuilt) == 0  # already there: nothing twice

    # rows already distilled stay; a prompt gone from the instructions file is left out
    instructions.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts[1:]))
    partial = tmp_path / "partial.jsonl"
    partial.write_text(json.dumps(rows[2]) + "\n")
    assert unpack(corpus, read_instructions(instructions), "train", partial) == 7
    assert len(partial.read_text().splitlines()) == 8


def _corpus_script():
    """scripts/corpus.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("corpus_script", ROOT / "scripts" / "corpus.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_corpus_keeps_the_chat_mix_answers_and_rebuilds_them_from_the_data(data, tmp_path):
    """scripts/corpus.py --split mix: the chat mix's answers are packed without their prompts
    and rebuilt from the data sets by the same N and seed; DialogSum's non-commercial dialogues
    are neither packed nor unpacked unless --mix-kinds asks, nor rows no mix prompt explains."""
    from specstream_mlx.training.chat_prompts import chat_mix_items, mix_kinds
    from specstream_mlx.training.corpus import read_shards

    script = _corpus_script()
    every = chat_mix_items(data, 25, 3, mix_kinds("all"))
    rows = _distilled_rows([it.prompt for it in every] + ["Not a prompt of the mix."])
    for row, item in zip(rows, every, strict=False):  # the last row: no item
        row["source"], row["category"] = item.source, item.category
    distilled, corpus = tmp_path / "mix.jsonl", tmp_path / "corpus"
    distilled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--split", "mix", "--chat-mix", "25", "--seed", "3", "--corpus", str(corpus)]
    common += ["--data-dir", str(data)]
    assert script.main(["pack", "--rows", str(distilled), *common]) == 0
    shard = corpus / "mix-00001.jsonl.gz"
    stored = gzip.decompress(shard.read_bytes()).decode()
    assert not any(it.prompt[:40] in stored for it in every)
    kept: dict = {}  # the first answer to each prompt
    for r in rows[: len(every)]:
        if r["category"] != "dialogue":
            kept.setdefault(r["prompt"], r)
    assert len(read_shards(corpus, "mix")) == len(kept) < len(every)

    rebuilt = tmp_path / "new" / "mix.jsonl"
    assert script.main(["unpack", "--rows", str(rebuilt), *common]) == 0
    got = {r["prompt"]: r for r in map(json.loads, rebuilt.read_text().splitlines())}
    assert got == kept
    other_seed = tmp_path / "other.jsonl"  # other prompts: only the answers they share
    assert script.main(["unpack", "--rows", str(other_seed), *common[:-2], "--seed", "4",
                        "--data-dir", str(data)]) == 0  # fmt: skip
    shared = {it.prompt for it in chat_mix_items(data, 25, 4)} & set(kept)
    lines = other_seed.read_text().splitlines() if other_seed.exists() else []
    assert sorted(json.loads(ln)["prompt"] for ln in lines) == sorted(shared)

    # --mix-kinds all: the dialogues' answers are packed and unpacked too
    everything = [*common[:-4], "--corpus", str(tmp_path / "all"), "--data-dir", str(data)]
    everything += ["--mix-kinds", "all"]
    assert script.main(["pack", "--rows", str(distilled), *everything]) == 0
    assert len(read_shards(tmp_path / "all", "mix")) == len({it.prompt for it in every})
    with_dialogues = tmp_path / "all.jsonl"
    assert script.main(["unpack", "--rows", str(with_dialogues), *everything]) == 0
    categories = {json.loads(ln)["category"] for ln in with_dialogues.read_text().splitlines()}
    assert "dialogue" in categories
    assert len(shared) < len(kept)


def test_a_second_mix_seed_packs_its_own_shard_and_unpacks_beside_the_first(data, tmp_path):
    """--seed 3 then --seed 4 pack one shard each (prompts both mixes hold only once), and
    --seed 3,4 unpacks the union; a seed that is not a number is one clear error."""
    from specstream_mlx.training.chat_prompts import chat_mix_items
    from specstream_mlx.training.corpus import read_shards

    script, corpus = _corpus_script(), tmp_path / "corpus"
    common = ["--split", "mix", "--chat-mix", "25", "--corpus", str(corpus)]
    common += ["--data-dir", str(data)]
    prompts = {}
    for seed in (3, 4):
        items = chat_mix_items(data, 25, seed)
        distilled = tmp_path / f"mix{seed}.jsonl"
        rows = _distilled_rows([it.prompt for it in items])
        distilled.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert script.main(["pack", "--rows", str(distilled), "--seed", str(seed), *common]) == 0
        for it in items:
            prompts.setdefault(it.prompt, it)
    names = [p.name for p in sorted(corpus.iterdir())]
    assert names == ["mix-00001.jsonl.gz", "mix-00002.jsonl.gz"]
    assert len(read_shards(corpus, "mix")) == len(prompts)  # a shared prompt is in one shard
    both = tmp_path / "both.jsonl"
    assert script.main(["unpack", "--rows", str(both), "--seed", "3,4", *common]) == 0
    got = [json.loads(ln) for ln in both.read_text().splitlines()]
    assert sorted(r["prompt"] for r in got) == sorted(prompts)
    assert all(r["category"] == prompts[r["prompt"]].category for r in got)
    with pytest.raises(SystemExit):
        script.main(["unpack", "--rows", str(both), "--seed", "three", *common])


def test_packing_the_same_rows_gives_the_same_bytes_and_a_damaged_shard_is_one_error(tmp_path):
    from specstream_mlx.training.corpus import pack, read_shards

    distilled = tmp_path / "d.jsonl"
    distilled.write_text("".join(json.dumps(r) + "\n" for r in _distilled_rows(["a", "b"])))
    one, two = pack(distilled, tmp_path / "x", "dev"), pack(distilled, tmp_path / "y", "dev")
    assert one.read_bytes() == two.read_bytes()
    one.write_bytes(one.read_bytes()[:20])
    with pytest.raises(ss.SpecstreamError, match="damaged"):
        read_shards(tmp_path / "x", "dev")
    distilled.write_text('{"prompt": "a"}\n')
    with pytest.raises(ss.SpecstreamError, match="missing completion"):
        pack(distilled, tmp_path / "z", "dev")


def test_packing_a_growing_file_leaves_the_line_in_flight(tmp_path):
    from specstream_mlx.training.corpus import pack, read_shards

    distilled = tmp_path / "d.jsonl"
    rows = _distilled_rows(["a", "b"])
    distilled.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1])[:25])
    pack(distilled, tmp_path / "c", "train")
    assert len(read_shards(tmp_path / "c", "train")) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "d.jsonl"]  # nothing left over
