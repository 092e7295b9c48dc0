"""`specstream bench`: every method on the same prompts, the documented JSON schema, the tables,
the plot, and clear errors for bad input."""

import json

import pytest
from mlx.utils import tree_flatten

import specstream_mlx as ss
from specstream_mlx.bench.report import markdown, plot
from specstream_mlx.bench.run import BenchConfig, run_bench
from specstream_mlx.bench.suites import read_suite
from specstream_mlx.streams.adapter_io import save_adapter
from specstream_mlx.streams.config import StreamConfig
from specstream_mlx.streams.params import StreamParams

from .test_cli import assert_clean_error, specstream

METHOD_KEYS = {
    "name", "adapter", "speedup_vs_ar", "tokens_per_second", "mean_accepted_tokens",
    "forward_passes", "quality", "identical_to_ar", "extra_params", "peak_memory_mb",
    "prefill_seconds", "decode_seconds", "generated_tokens", "samples", "per_category", "tree",
    "ran",
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_adapter(tiny_folders, tmp_path_factory):
    loaded = ss.load(str(tiny_folders["llama"]))
    cfg = StreamConfig(gamma=2, n_msa_layers=2, top_k=2, max_tree_nodes=6)
    params = StreamParams(cfg.validate(loaded.config["num_hidden_layers"]), 64).randomize(1)
    return save_adapter(tmp_path_factory.mktemp("bench") / "adapter", params, loaded)


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "question.jsonl"
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["Write a b c a b c", "Again."]},
        {"question_id": 2, "category": "math", "turns": ["1 2 3 1 2 3 1 2"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_method_in_the_documented_schema(tiny_folders, tiny_adapter, questions, tmp_path):
    config = BenchConfig(
        suite="mtbench",
        data=str(questions),
        max_tokens=12,
        methods=("ar", "ss", "pld", "ss+pld", "mlx-lm"),
        adapter=str(tiny_adapter),
        model=str(tiny_folders["llama"]),
    )
    report = run_bench(config)
    json.dumps(report)  # serialisable as is
    assert set(report) == {
        "suite", "machine", "provenance", "config", "methods", "unavailable", "stream_acceptance"
    }  # fmt: skip
    rates = report["stream_acceptance"]  # the streams, probed on the run's 2 first turns
    gamma = ss.load(config.model, adapter=config.adapter).streams.config.gamma
    assert rates["positions"] > 0 and "2 prompts" in rates["source"]
    for key in ("top1_given_earlier_right", "top3_given_earlier_in_top3"):
        assert len(rates[key]) == gamma and all(0 <= r <= 1 for r in rates[key])
    assert {"platform", "backend", "blas", "mlx", "mlx_lm"} <= set(report["machine"])
    assert report["provenance"]["versions"]["mlx"] == report["machine"]["mlx"]
    assert report["provenance"]["commit"] is None or len(report["provenance"]["commit"]) >= 40
    assert report["config"]["methods"] == ["ar", "ss", "pld", "ss+pld", "mlx-lm"]
    assert "draft-model" in report["unavailable"]
    by_name = {m["name"]: m for m in report["methods"]}
    assert list(by_name) == ["ar", "ss", "pld", "ss+pld", "mlx-lm"]
    for m in by_name.values():
        assert set(m) == METHOD_KEYS
        assert m["samples"] == 3  # 2 turns + 1 turn
        assert set(m["per_category"]) == {"writing", "math"}
        assert m["per_category"]["writing"]["samples"] == 2
        assert m["quality"] == {}  # no references in a question file
    assert by_name["ar"]["identical_to_ar"] is None
    assert by_name["ar"]["mean_accepted_tokens"] == 1.0
    # lossless methods give exactly ar's tokens
    for name in ("ss", "pld", "ss+pld"):
        assert by_name[name]["identical_to_ar"] == 1.0
    assert by_name["ss+pld"]["adapter"] == str(tiny_adapter)
    assert by_name["ss"]["extra_params"] > 0 and by_name["ss"]["adapter"] == str(tiny_adapter)
    assert by_name["pld"]["extra_params"] == 0 and by_name["mlx-lm"]["extra_params"] == 0
    # the speculative decoders report their tree (this adapter has no acceptance statistics)
    assert by_name["ss"]["tree"]["source"] == "adapter" and by_name["ar"]["tree"] is None
    assert by_name["pld"]["tree"]["source"] == "lookup"  # and whether its chains were gated
    assert by_name["ss+pld"]["tree"]["lookup_gated"] == by_name["pld"]["tree"]["lookup_gated"]
    assert by_name["ss"]["ran"] == ["ss"] and by_name["mlx-lm"]["ran"] == ["mlx-lm"]
    # memory: each method's own weights at least (not every model the process holds)
    weights_mb = sum(v.nbytes for _, v in tree_flatten(ss.load(config.model).model.parameters()))
    for m in by_name.values():
        assert weights_mb / 2**20 <= m["peak_memory_mb"] < 3 * weights_mb / 2**20 + 50
    table = markdown(report)
    for name in by_name:
        assert f"| {name} |" in table
    assert "| writing | 2 |" in table and "Not run: draft-model" in table
    assert f"streams on {rates['positions']} positions" in table
    assert "\npld: lookup chains" in table and "\nss+pld: lookup chains" in table
    plot(report, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def lora_folder(tiny_folders, tmp_path):
    """A next-token LoRA adapter with random (non-zero) layers."""
    from specstream_mlx.streams.adapter_io import save_lora_adapter
    from specstream_mlx.streams.lora import apply_lora

    from .test_shared import randomize_lora

    loaded = ss.load(str(tiny_folders["llama"]))
    apply_lora(loaded.model, rank=4, scale=20.0)
    randomize_lora(loaded.model, seed=5)
    return save_lora_adapter(tmp_path / "lora", loaded)


def test_app_suite_scores_quality_against_every_reference(tiny_folders, tmp_path):
    data = tmp_path / "dev.csv"
    data.write_text(
        "mr,ref\n"
        'name[Aromi],"Aromi is a pub."\n'
        'name[Aromi],"Aromi is a coffee shop."\n'
        'name[Bibimbap],"Bibimbap is cheap."\n'
    )
    config = BenchConfig(
        suite="e2e",
        data=str(data),
        max_tokens=6,
        methods=("ar", "pld", "lora"),
        model=str(tiny_folders["llama"]),
        lora=str(lora_folder(tiny_folders, tmp_path)),
    )
    report = run_bench(config)
    ar, pld, lora = report["methods"]
    assert lora["adapter"] == config.lora and lora["identical_to_ar"] < 1.0  # another model
    for m in report["methods"]:
        assert m["samples"] == 2  # grouped by MR
        assert set(m["quality"]) == {"rouge1", "rougeLsum"}
        assert list(m["per_category"]) == ["data2text"]
    assert report["config"]["adapter"] is None  # no ss: no adapter needed


def test_suite_readers_and_bad_input(tmp_path):
    with pytest.raises(ss.SpecstreamError, match="unknown suite"):
        read_suite("humaneval", tmp_path)
    with pytest.raises(ss.SpecstreamError, match="not found"):
        read_suite("specbench", tmp_path / "missing.jsonl")
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["hi"]}\n{"question_id": 2}\nnot json\n')
    with pytest.raises(ss.SpecstreamError, match="line 2: no field 'turns'.*line 3"):
        read_suite("specbench", bad)
    with pytest.raises(ss.SpecstreamError, match="limit must be >= 1"):
        read_suite("specbench", bad, limit=0)
    csv = tmp_path / "dev.csv"
    csv.write_text("mr,ref\nname[A],A is a pub.\nname[B],B is a cafe.\n")
    with pytest.raises(ss.SpecstreamError, match="is not a JSON Lines file .*: line 1: invalid"):
        read_suite("sql", csv)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"question_id": 7, "turns": ["a", "b"]}\n')
    (q,) = read_suite("mtbench", ok)
    assert (q.id, q.category, q.turns) == ("7", "all", ["a", "b"])


def test_chat_suite_is_the_held_out_mix(data):
    questions = read_suite("chat", data, limit=10)
    assert len(questions) == 10
    assert {q.category for q in questions} <= {
        "instruction", "passage", "dialogue", "data2text", "sql"
    }  # fmt: skip


def test_cli_bad_input_is_one_clear_line(tiny_folders, tiny_adapter, questions, tmp_path):
    model = ("--model", str(tiny_folders["llama"]))
    args = ("--suite", "mtbench", "--data", str(questions), "--limit", "1", *model)
    proc = specstream("bench", *args, "--methods", "ar,lora", "--lora", str(tiny_adapter))
    assert_clean_error(proc, "is a stream adapter, not a next-token LoRA")
    assert_clean_error(
        specstream("bench", "--suite", "humaneval", "--data", str(questions)), "invalid choice"
    )
    assert_clean_error(
        specstream("bench", "--suite", "sql", "--data", str(tmp_path / "none.jsonl"), *model),
        "data file not found",
    )
    assert_clean_error(
        specstream("bench", "--suite", "sql", "--data", str(tmp_path), *model),
        f"data file {tmp_path} is a folder",
    )
    assert_clean_error(
        specstream("bench", "--suite", "mtbench", "--data", str(questions), "--limit", "0"),
        "--limit",
    )
    assert_clean_error(
        specstream(
            "bench",
            "--suite",
            "mtbench",
            "--data",
            str(questions),
            "--methods",
            "ar,medusa",
            *model,
        ),
        "medusa needs trained heads",
    )
    assert_clean_error(
        specstream(
            "bench", "--suite", "mtbench", "--data", str(questions), "--methods", "ar,eagle", *model
        ),
        "unknown method eagle",
    )
    assert_clean_error(
        specstream(
            "bench", "--suite", "mtbench", "--data", str(questions), "--methods", "ss,pld", *model
        ),
        "must include ar",
    )


def test_bench_samples_with_the_speculative_methods(
    tiny_folders, tiny_adapter, questions, tmp_path
):
    out = tmp_path / "r.json"
    proc = specstream(
        "bench", "--suite", "specbench", "--data", str(questions), "--limit", "1",
        "--max-tokens", "6", "--methods", "ar,ss,ss+pld", "--adapter", str(tiny_adapter),
        "--model", str(tiny_folders["llama"]), "--temp", "0.7", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["config"]["temp"] == 0.7
    for row in report["methods"]:
        assert row["identical_to_ar"] is None  # samples are not compared token by token
        assert row["generated_tokens"] >= 1 and row["mean_accepted_tokens"] >= 1


def test_cli_writes_json_markdown_and_plot(tiny_folders, tiny_adapter, questions, tmp_path):
    out = tmp_path / "r"
    proc = specstream(
        "bench", "--suite", "specbench", "--data", str(questions), "--limit", "1",
        "--max-tokens", "5", "--methods", "ar,ss", "--adapter", str(tiny_adapter),
        "--model", str(tiny_folders["llama"]), "--json", f"{out}.json",
        "--markdown", f"{out}.md", "--plot", f"{out}.png",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [m["name"] for m in report["methods"]] == ["ar", "ss"]
    assert (tmp_path / "r.md").read_text() in proc.stdout
    assert (tmp_path / "r.png").stat().st_size > 0
    # a report already there is kept unless --overwrite: refused before the run starts
    again = (
        "bench", "--suite", "specbench", "--data", str(questions), "--limit", "1",
        "--max-tokens", "5", "--methods", "ar", "--model", str(tiny_folders["llama"]),
        "--json", f"{out}.json", "--markdown", f"{out}.md",
    )  # fmt: skip
    before = (tmp_path / "r.json").read_bytes()
    assert_clean_error(specstream(*again), f"--json {out}.json exists", "--overwrite")
    assert (tmp_path / "r.json").read_bytes() == before
    proc = specstream(*again, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert [m["name"] for m in json.loads((tmp_path / "r.json").read_text())["methods"]] == ["ar"]
