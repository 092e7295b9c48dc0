"""The `specstream` console script run as a user runs it: bad input gives one clear line, exit 2."""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specstream_mlx.models.loader import default_gguf_path


def specstream(*args, stdin=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "specstream_apps.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=1200,  # a hang guard: a fresh cache measures the latency curve (~5 min here)
        env={**os.environ, **(env or {})},
    )


def assert_clean_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_generate_json_on_default_model():
    proc = specstream("generate", "--prompt", "What is the capital of France?", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"] == "The capital of France is Paris."
    assert out["decoder"] == "ar" and out["model"] == "smollm2-135m-instruct"
    assert out["stats"]["mean_accepted_tokens"] == 1.0


def quickstart_commands() -> list[list[str]]:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.strip().splitlines()]


def test_quickstart_command_decodes_exactly_with_the_chat_adapter():
    """The README's first command, as written: the shipped chat adapter, lossless, compared
    with plain decoding."""
    first, second = quickstart_commands()
    assert first[:2] == ["./dev.sh", "specstream"] and second == ["./dev.sh", "pytest", "-q"]
    assert first[first.index("--adapter") + 1] == "chat"
    proc = specstream(*first[2:])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    verdict = r"decodes [0-9.]+x as fast as plain decoding \(decode tokens/s, prompt excluded\); "
    assert re.search(verdict + "outputs identical", proc.stderr)
    json_proc = specstream(*first[2:], "--json")
    out = json.loads(json_proc.stdout)
    # ss+pld, or pld where no tree of the chat streams pays on this device (then said so)
    assert out["decoder"] in ("ss+pld", "pld") and out["compare"]["identical"] is True
    assert (out["adapter"] == "chat") == (out["decoder"] == "ss+pld")
    assert out["text"] == proc.stdout.strip()


def test_generate_streams_text_and_stats(tiny_folders):
    proc = specstream(
        "generate",
        "--model",
        str(tiny_folders["llama"]),
        "--prompt",
        "-",
        "--max-tokens",
        "5",
        stdin="hello from stdin",
    )
    assert proc.returncode == 0, proc.stderr
    assert "5 tokens" in proc.stderr and "tokens/s" in proc.stderr


def test_help_everywhere():
    for args in ([], ["generate"], ["export-model"]):
        proc = specstream(*args, "--help")
        assert proc.returncode == 0 and "usage: specstream" in proc.stdout


def test_unknown_model_lists_what_was_tried(tmp_path):
    proc = specstream("generate", "--prompt", "hi", "--model", str(tmp_path / "nope"))
    assert_clean_error(proc, "not found", "tried", "does not exist")
    proc = specstream("generate", "--prompt", "hi", "--model", str(tmp_path))
    assert_clean_error(proc, "no config.json")
    proc = specstream("generate", "--prompt", "hi", "--model", "nobody/no-such-model")
    assert_clean_error(proc, "Hugging Face hub id nobody/no-such-model")


def test_corrupt_and_truncated_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file" * 10)
    env = {"SPECSTREAM_CACHE": str(tmp_path / "cache")}
    assert_clean_error(
        specstream("generate", "--prompt", "hi", "--model", str(junk), env=env),
        "cannot read GGUF",
        "corrupt or truncated",
    )
    truncated = tmp_path / "truncated.gguf"
    with open(default_gguf_path(), "rb") as src:
        truncated.write_bytes(src.read(5_000_000))
    assert_clean_error(
        specstream("generate", "--prompt", "hi", "--model", str(truncated), env=env),
        "cannot read GGUF",
        "corrupt or truncated",
    )


def test_truncated_safetensors(tmp_path, tiny_folders):
    broken = shutil.copytree(tiny_folders["llama"], tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert_clean_error(
        specstream("generate", "--prompt", "hi", "--model", str(broken)), "corrupt or truncated"
    )


def test_prompt_longer_than_context(tiny_folders):
    proc = specstream(
        "generate", "--prompt", "y" * 600, "--raw", "--model", str(tiny_folders["llama"])
    )
    assert_clean_error(proc, "600 tokens", "context holds 256")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--prompt", ""], "prompt is empty"),
        (["--prompt", "hi", "--max-tokens", "0"], "--max-tokens"),
        (["--prompt", "hi", "--max-tokens", "lots"], "--max-tokens"),
        (["--prompt", "hi", "--temp", "-1"], "temperature must be >= 0"),
        (["--prompt", "hi", "--top-p", "0"], "--top-p"),
        (["--prompt", "hi", "--top-k", "-3"], "--top-k"),
        (["--prompt", "hi", "--decoder", "nope"], "--decoder"),
        (["--prompt", "hi", "--compare"], "--compare compares a speculative decoder"),
        (["--prompt", "hi", "--precision", "int3"], "--precision"),
        (["--prompt", "hi", "--no-such-flag"], "unrecognized arguments"),
        (["--prompt", "hi", "--model", " "], "--model: empty: name a model"),
        ([], "required: --prompt"),
    ],
)
def test_invalid_flags(flags, fragment, tiny_folders):
    proc = specstream("generate", "--model", str(tiny_folders["llama"]), *flags)
    assert_clean_error(proc, fragment)


def test_closed_stdin_reads_as_empty(tiny_folders):
    """`<&-`: no traceback (sys.stdin is None then) and no file taking descriptor 0."""
    model = ["--model", str(tiny_folders["llama"])]
    closed = dict(capture_output=True, text=True, timeout=600, preexec_fn=lambda: os.close(0))
    cli = [sys.executable, "-m", "specstream_apps.cli"]
    proc = subprocess.run([*cli, "generate", *model, "--prompt", "-"], **closed)
    assert_clean_error(proc, "prompt is empty")
    proc = subprocess.run([*cli, "write", "summarize", "--max-tokens", "4"], **closed)
    assert_clean_error(proc, "the input is empty")
    proc = subprocess.run([*cli, "chat", *model, "--decoder", "ar", "--max-tokens", "2"], **closed)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_write_takes_its_text_after_the_options():
    proc = specstream("write", "sql", "--max-tokens", "4", "how many users?")
    assert_clean_error(proc, "sql needs --context")  # the text was taken; the tables are missing
    proc = specstream("write", "sql", "one", "--max-tokens", "4", "two")
    assert_clean_error(proc, "unrecognized arguments for write: two")


def test_generate_ss_json_with_adapter(tmp_path, tiny_folders):
    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import save_adapter
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.params import StreamParams

    model = str(tiny_folders["llama"])
    loaded = ss.load(model)
    params = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(0)
    adapter = save_adapter(tmp_path / "adapter", params, loaded)
    base = ["generate", "--model", model, "--prompt", "hello", "--max-tokens", "12", "--json"]
    plain = json.loads(specstream(*base).stdout)
    proc = specstream(*base, "--decoder", "ss", "--adapter", str(adapter), "--tree-top-k", "2")
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(proc.stdout)
    assert spec["token_ids"] == plain["token_ids"]
    assert spec["decoder"] == "ss" and spec["adapter"] == str(adapter)
    assert spec["stats"]["tree_nodes"] >= spec["stats"]["tree_nodes_kept"] >= 1
    clash = specstream(*base, "--decoder", "ss", "--adapter", str(adapter), "--gamma", "3")
    assert_clean_error(clash, "the adapter fixes gamma=3 (adapter has 2)")
    assert_clean_error(
        specstream(*base, "--adapter", str(adapter)), "--adapter needs --decoder ss, ss+pld or pld"
    )
    assert_clean_error(
        specstream(*base, "--decoder", "ss", "--adapter", str(tmp_path)), "not an adapter folder"
    )


@pytest.mark.parametrize(
    "metadata, fragment",
    [
        ({"llama__attention__head_count": 0}, "head_count must be a positive integer, got 0"),
        ({"llama__attention__head_count": 7}, "heads must divide the width"),
        ({"tokenizer__ggml__tokens": None}, "no vocabulary (tokenizer.ggml.tokens)"),
        ({"tokenizer__ggml__merges": None}, "no BPE merges"),
        ({"llama__block_count": 5}, "block_count 5, the file has tensors for blocks 0-1"),
        ({"llama__feed_forward_length": 100}, "Expected shape (100, 64)"),  # converts, no load
    ],
)
def test_gguf_with_bad_metadata_fails_cleanly_and_leaves_no_cache(tmp_path, monkeypatch, metadata,
                                                                   fragment):  # fmt: skip
    from specstream_mlx import SpecstreamError, load_model
    from specstream_mlx.models.loader import cache_dir

    from .tiny_gguf import save_tiny_gguf

    monkeypatch.setenv("SPECSTREAM_CACHE", str(tmp_path / "cache"))
    gguf = save_tiny_gguf(tmp_path / "bad.gguf", **metadata)
    with pytest.raises(SpecstreamError) as err:
        load_model(str(gguf))
    assert fragment in str(err.value) and "\n" not in str(err.value)
    models = cache_dir() / "models"
    assert not models.exists() or not list(models.iterdir())


def test_gguf_errors_are_one_line_on_the_command_line(tmp_path):
    from .tiny_gguf import save_tiny_gguf

    env = {"SPECSTREAM_CACHE": str(tmp_path / "cache")}
    good = save_tiny_gguf(tmp_path / "good.gguf")
    proc = specstream("generate", "--prompt", "hi", "--model", str(good), "--max-tokens", "2",
                      env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    bad = save_tiny_gguf(tmp_path / "bad.gguf", llama__block_count=31)
    proc = specstream("generate", "--prompt", "hi", "--model", str(bad), env=env)
    assert_clean_error(proc, "block_count 31")


def specstream_bytes(*args, stdin: bytes = b""):
    """`specstream` with arguments and stdin as raw bytes (undecodable input)."""
    proc = subprocess.run(
        [sys.executable, "-m", "specstream_apps.cli", *args],
        capture_output=True,
        input=stdin,
        timeout=300,
    )
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def test_undecodable_text_is_one_clear_line(tiny_folders):
    model = ["--model", str(tiny_folders["llama"])]
    proc = specstream_bytes("generate", *model, "--prompt", "-", stdin=b"hi \xff\xfe there")
    assert_clean_error(proc, "the prompt on stdin is not UTF-8 text", "0xff at offset 3")
    proc = specstream_bytes("generate", *model, "--prompt", b"hi \xff")
    assert_clean_error(proc, "--prompt is not valid UTF-8 text (undecodable byte 0xff")
    proc = specstream_bytes("chat", *model, stdin=b"\xff\xfe\n/stats\n")  # that line alone goes
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "(that line is not valid UTF-8 text (undecodable byte 0xff" in proc.stderr
    assert "0 answers" in proc.stderr  # the session went on to the next line
    proc = specstream_bytes("chat", *model, "--system", b"be \xff")
    assert_clean_error(proc, "--system is not valid UTF-8 text")
    proc = specstream_bytes("write", "summarize", *model, stdin=b"\x00\xff\xfe")
    assert_clean_error(proc, "on stdin is not UTF-8 text")


@pytest.mark.parametrize(
    "base_model",
    ["smollm2", {"name": "x", "fingerprint": ["a", "b"]}, None],
)
def test_adapter_config_with_a_malformed_base_model(tmp_path, tiny_folders, base_model):
    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import CONFIG, made_for, read_adapter, save_adapter
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.params import StreamParams

    model = str(tiny_folders["llama"])
    loaded = ss.load(model)
    params = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(0)
    folder = save_adapter(tmp_path / "adapter", params, loaded)
    config = json.loads((folder / CONFIG).read_text())
    config["base_model"] = base_model
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(ss.SpecstreamError, match="base_model must be an object"):
        read_adapter(folder, loaded)
    assert made_for(folder, loaded) is False
    if base_model is not None:  # the command line, once is enough
        return
    proc = specstream("generate", "--model", model, "--prompt", "hi", "--decoder", "ss",
                      "--adapter", str(folder))  # fmt: skip
    assert_clean_error(proc, "base_model must be an object")
    with socket.socket() as s:  # a free port: serve binds it before reading the adapter
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    proc = specstream("serve", "--model", model, "--adapter", f"mine={folder}", "--port", port)
    assert_clean_error(proc, "base_model must be an object")
    proc = specstream("convert", "--from", str(folder), "--to", str(tmp_path / "out"),
                      "--no-check")  # fmt: skip
    assert_clean_error(proc, "base_model must be an object")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format_version": 99}, "format_version 99; this version of specstream-mlx reads format"),
        ({"format_version": "1"}, "format_version must be an integer, got '1'"),
        ({"stream_config": None}, "no stream_config"),
        ({"stream_config": "x"}, "stream_config must be an object"),
        ({"stream_config": {"gamma": 2, "n_msa_layers": 2, "gama": 3}}, "field(s) gama"),
    ],
)
def test_adapter_config_of_another_format_is_named(tmp_path, tiny_folders, change, message):
    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import CONFIG, read_adapter, save_adapter
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.params import StreamParams

    loaded = ss.load(str(tiny_folders["llama"]))
    params = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(0)
    folder = save_adapter(tmp_path / "adapter", params, loaded)
    config = json.loads((folder / CONFIG).read_text())
    for key, value in change.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (folder / CONFIG).write_text(json.dumps(config))
    with pytest.raises(ss.SpecstreamError, match=re.escape(message)):
        read_adapter(folder, loaded)
    from convert import adapter_format as af

    if "stream_config" not in config:  # to convert, an MLX LoRA folder
        message = "an MLX LoRA folder without streams"
    with pytest.raises(ss.SpecstreamError, match=re.escape(message)) as err:  # convert's reader
        af.read_folder(folder)
    assert str(folder) in str(err.value)


def test_adapter_config_errors_name_the_file(tmp_path, tiny_folders):
    """A config without its base model, or whose LoRA blocks the model lacks: one message that
    names the file and what is wrong."""
    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import CONFIG, read_adapter, save_adapter
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.params import StreamParams

    loaded = ss.load(str(tiny_folders["llama"]))
    params = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(0)
    folder = save_adapter(tmp_path / "adapter", params, loaded)
    saved = json.loads((folder / CONFIG).read_text())
    (folder / CONFIG).write_text(json.dumps({k: v for k, v in saved.items() if k != "base_model"}))
    with pytest.raises(ss.SpecstreamError, match=re.escape(f"{folder / CONFIG}: no base_model")):
        read_adapter(folder, loaded)
    blocks = {**saved, "stream_config": {**saved["stream_config"], "lora_blocks": [99]}}
    (folder / CONFIG).write_text(json.dumps(blocks))
    with pytest.raises(ss.SpecstreamError) as err:
        read_adapter(folder, loaded)
    assert str(folder / CONFIG) in str(err.value)
    assert "lora_blocks (99,) names blocks the model lacks" in str(err.value)


UNWRITABLE = "/proc/specstream-test"  # no file can be made there, even by root


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path, tiny_folders):
    model = ["--model", str(tiny_folders["llama"])]
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "p", "completion": "c"}\n' * 3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi"}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    train = ["train", *model, "--data", str(data), "--steps", "1"]
    bench = ["bench", *model, "--suite", "specbench", "--data", str(prompts), "--limit", "1"]
    cases = [
        (train + ["--out", str(a_file), "--overwrite"], "is a file: give a folder"),
        (train + ["--out", UNWRITABLE + "/adapter"], "cannot write in /proc"),
        (train + ["--out", str(tmp_path / "x"), "--lr", "nan"], "--lr"),
        (bench + ["--json", UNWRITABLE + ".json"], "cannot write in /proc"),
        (bench + ["--markdown", str(tmp_path)], "is a folder: give a file"),
        (["distill", *model, "--prompts", str(prompts), "--out", str(tmp_path)], "is a folder"),
        (["export-model", "--out", str(a_file), "--overwrite"], "is a file: give a folder"),
        (["serve", "--port", "99999"], "1-65535"),
    ]
    for argv, fragment in cases:
        assert_clean_error(specstream(*argv), fragment)
    assert a_file.read_text() == "x"  # nothing replaced or moved aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "prompts.jsonl", "train.jsonl"]


def test_an_output_folder_that_holds_other_things_is_never_replaced(tmp_path, tiny_folders):
    """--overwrite replaces an adapter, model or checkpoint folder, never the current folder, a
    folder above it or one holding other files (a conversion into --from's parent once deleted
    --from)."""
    from specstream_apps.args import output_folder

    import specstream_mlx as ss
    from specstream_mlx.folders import staged_folder
    from specstream_mlx.streams.adapter_io import save_adapter
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.params import StreamParams

    loaded = ss.load(str(tiny_folders["llama"]))
    params = StreamParams(StreamConfig(gamma=2, n_msa_layers=2), 64).randomize(0)
    home = tmp_path / "home"
    source = save_adapter(home / "src", params, loaded)
    (home / "notes.txt").write_text("mine")
    convert = ["convert", "--from", str(source), "--no-check", "--overwrite", "--to"]
    assert_clean_error(specstream(*convert, str(home)), "must differ from --from and not hold it")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert_clean_error(specstream(*convert, str(other)), "holds files that are not an adapter")
    cwd = Path.cwd()
    try:
        os.chdir(home)
        for out in (".", "", str(tmp_path)):
            with pytest.raises(ss.SpecstreamError, match="is the current folder or holds it"):
                output_folder(out, "--out", True)
            with pytest.raises(ss.SpecstreamError, match="is the current folder or holds it"):
                with staged_folder(out, overwrite=True):
                    pass
    finally:
        os.chdir(cwd)
    assert (home / "notes.txt").read_text() == "mine" and (other / "notes.txt").is_file()
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "src"]
    proc = specstream(*convert, str(home / "src2"))  # a new folder, then replaced: allowed
    assert proc.returncode == 0, proc.stderr
    proc = specstream(*convert, str(home / "src2"))
    assert proc.returncode == 0, proc.stderr


def test_a_staged_folder_names_a_file_in_its_way(tmp_path):
    """An output that is a file, or below one: said so, whatever --overwrite says, and the
    file kept."""
    import specstream_mlx as ss
    from specstream_mlx.folders import staged_folder

    (tmp_path / "a_file").write_text("x")
    for overwrite in (False, True):
        with pytest.raises(ss.SpecstreamError, match="exists and is not a folder"):
            with staged_folder(tmp_path / "a_file", overwrite):
                pass
        with pytest.raises(ss.SpecstreamError, match=f"{tmp_path / 'a_file'} is a file, not a"):
            with staged_folder(tmp_path / "a_file" / "sub" / "out", overwrite):
                pass
    assert (tmp_path / "a_file").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_distill_reads_prompt_rows_and_names_the_bad_ones(tmp_path, tiny_folders):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Say hi"}\n{"prompt": "  "}\n{"text": "no prompt"}\n')
    out = tmp_path / "answers.jsonl"
    argv = ["distill", "--model", str(tiny_folders["llama"]), "--prompts", str(prompts)]
    assert_clean_error(
        specstream(*argv, "--out", str(out)),
        "line 2: the prompt is empty",
        'line 3: needs a "prompt" string',
    )
    assert_clean_error(specstream(*argv, "--out", str(prompts)), "--out must differ")
    assert_clean_error(
        specstream(*argv, "--data-file", str(prompts), "--out", str(out)), "goes with --task"
    )
    task = ["distill", "--task", "sql", "--data-file", str(prompts), "--out", str(prompts)]
    assert_clean_error(specstream(*task), "--out must differ from --data-file")
    prompts.write_text('{"prompt": "Say hi"}\n')
    proc = specstream(*argv, "--out", str(out), "--max-tokens", "4", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["prompt"] == "Say hi"
