"""`specstream write`: the writing tools on the default model with their shipped adapters, on
rows of the data sets (the `data` fixture: the real ones, or invented ones in their shapes)."""

import csv
import json
import re

import pytest

import specstream_mlx as ss
from specstream_mlx.tasks import get_task

from .test_cli import assert_clean_error, specstream


@pytest.mark.slow
def test_sql_tool_is_lossless_against_its_adapters_plain_decoding(data):
    with open(data / "sql" / "dev.jsonl") as f:
        row = json.loads(next(f))
    proc = specstream(
        "write", "sql", row["question"], "--context", row["context"], "--max-tokens", "40",
        "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # ss+pld, or pld where no tree of the sql streams pays on this device (reported as such)
    assert out["decoder"] in ("ss+pld", "pld") and out["adapter"] == "sql"
    loaded = ss.load(adapter="sql")
    prompt = get_task("sql").prompt(question=row["question"], context=row["context"])
    plain = ss.generate(loaded, prompt, max_tokens=40)  # ar on the adapter's model
    assert out["token_ids"] == plain.token_ids
    assert out["text"].upper().startswith("SELECT")


@pytest.mark.slow
def test_summarize_reads_stdin_and_streams_with_stats(data):
    with open(data / "dialogsum" / "dev.jsonl") as f:
        dialogue = json.loads(next(f))["dialogue"]
    proc = specstream("write", "summarize", "--max-tokens", "24", stdin=dialogue)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert re.search(r"\[(ss\+pld|pld), summarize\]", proc.stderr) and "tokens/s" in proc.stderr


@pytest.mark.slow
def test_batch_resumes_after_an_interruption(tmp_path, data):
    with open(data / "e2e" / "dev.csv", newline="") as f:
        mrs = list(dict.fromkeys(r["mr"] for r in csv.DictReader(f)))[:3]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"mr": mr}) + "\n" for mr in mrs))
    out = tmp_path / "out.jsonl"
    args = ("write", "data2text", "--input", str(rows), "--output", str(out), "--max-tokens", "20")
    proc = specstream(*args)
    assert proc.returncode == 0, proc.stderr
    full = out.read_text().splitlines()
    assert [json.loads(line)["row"] for line in full] == [1, 2, 3]
    assert all(json.loads(line)["text"] for line in full)
    # Interrupted while writing row 2: its line cut short.
    out.write_text(full[0] + "\n" + full[1][:10])
    proc = specstream(*args)
    assert proc.returncode == 0, proc.stderr
    assert "resumed: rows 1-1" in proc.stderr
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert again[0] == json.loads(full[0])  # kept as it was
    # the same rows and greedy texts (timings differ)
    assert [(r["row"], r["text"]) for r in again] == [
        (r["row"], r["text"]) for r in map(json.loads, full)
    ]
    # Damage before the last line, or another batch's output: refused, the file left alone.
    for bad in (full[0] + "\n\n" + full[1] + "\n", full[1] + "\n"):
        out.write_text(bad)
        assert_clean_error(specstream(*args), "give another --output")
        assert out.read_text() == bad


@pytest.mark.parametrize(
    "args, stdin, fragment",
    [
        (["sql", "How many?"], None, "sql needs --context"),
        (["summarize", "   "], None, "the input is empty"),
        (["summarize", "-"], "", "the input is empty"),
        (["summarize", "--output", "o.jsonl"], None, "--output is for batches"),
        (["summarize", "--file", "/no/such/file"], None, "cannot read /no/such/file"),
        (["poem", "x"], None, "invalid choice: 'poem'"),
    ],
)
def test_bad_input_is_one_clear_line(args, stdin, fragment):
    assert_clean_error(specstream("write", *args, stdin=stdin), fragment)


def test_malformed_batch_rows_are_reported_by_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        '{"question": "q", "context": "CREATE TABLE t (a INT)"}\nnot json\n["x"]\n'
        '{"question": 5, "context": "CREATE TABLE t (a INT)"}\n'
    )
    proc = specstream("write", "sql", "--input", str(rows))
    assert_clean_error(
        proc, "line 2: invalid JSON", "line 3: expected an object", "line 4: question must be text"
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert_clean_error(specstream("write", "sql", "--input", str(empty)), "no rows in")
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"question": "q"}\n')
    assert_clean_error(specstream("write", "sql", "--input", str(missing)), "missing input context")


def test_a_bad_output_or_input_file_fails_before_the_model_loads(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"dialogue": "A: hi"}\n')
    binary = tmp_path / "out.bin"
    binary.write_bytes(b"\x00\xff\xfe\x00")
    no_model = ["--model", str(tmp_path / "no-model")]  # loading it would be the error
    for output, fragment in [
        (binary, "is not a text file"),
        (tmp_path, "is a folder"),
        (tmp_path / "nowhere" / "out.jsonl", "no folder"),
    ]:
        proc = specstream("write", "summarize", "--input", str(rows), "--output", str(output),
                          *no_model)  # fmt: skip
        assert_clean_error(proc, fragment)
    binary_rows = tmp_path / "rows.bin"
    binary_rows.write_bytes(b'{"dialogue": "A: hi"}\n\xff\xfe\x00\n')
    proc = specstream("write", "summarize", "--input", str(binary_rows), *no_model)
    assert_clean_error(proc, "line 2: not UTF-8 text")
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"dialogue": "A: hi \\ud800"}\n')
    proc = specstream("write", "summarize", "--input", str(surrogate), *no_model)
    assert_clean_error(proc, "line 1: the row is not valid UTF-8 text (lone surrogate U+D800")


def test_a_batch_never_resumes_into_another_batchs_output(tmp_path):
    from specstream_apps.write_cmd import input_digest

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"mr": "name[A], food[Thai]"}) + "\n")
    prompt = get_task("data2text").prompt(mr="name[A], food[Thai]")
    out = tmp_path / "out.jsonl"
    args = ("write", "data2text", "--input", str(rows), "--output", str(out))
    ours = {"row": 1, "text": "x", "input": input_digest(prompt)}
    theirs = {"row": 1, "text": "x", "input": input_digest("another prompt")}
    longer = {"row": 2, "text": "y"}  # an older file without digests, from a longer batch
    for lines in ([theirs], [ours, longer]):
        written = "".join(json.dumps(line) + "\n" for line in lines)
        out.write_text(written)
        assert_clean_error(specstream(*args), "written for another input", "another --output")
        assert out.read_text() == written
