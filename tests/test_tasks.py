"""Writing-tool tasks: prompt templates and readers over the data sets (the `data` fixture: the
real ones in ../shared/data, or invented ones in their shapes)."""

import csv
import json

import pytest

import specstream_mlx as ss
from specstream_mlx.tasks import TASKS, get_task, read_task_examples
from specstream_mlx.training.data import load_dataset

FILES = {"summarize": "dialogsum/dev.jsonl", "data2text": "e2e/dev.csv", "sql": "sql/dev.jsonl"}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_dev_files_read_with_the_tool_template(name, data):
    path = data / FILES[name]
    examples = read_task_examples(name, path)
    if name == "data2text":  # one example per MR
        with open(path, encoding="utf-8", newline="") as f:
            assert len(examples) == len({row["mr"] for row in csv.DictReader(f)})
    else:  # one example per row
        assert len(examples) == len(path.read_text(encoding="utf-8").splitlines())
    first = examples[0]
    assert first.prompt.startswith(get_task(name).template.split("{")[0])
    assert all(ex.references and all(r.strip() for r in ex.references) for ex in examples)


def test_e2e_groups_references_by_mr(data):
    examples = read_task_examples("data2text", data / "e2e" / "dev.csv")
    prompts = [ex.prompt for ex in examples]
    assert len(prompts) == len(set(prompts))  # one example per MR
    assert max(len(ex.references) for ex in examples) > 1  # several references per MR
    rows = sum(1 for _ in open(data / "e2e" / "dev.csv", encoding="utf-8")) - 1
    assert sum(len(ex.references) for ex in examples) <= rows


def test_dialogsum_extra_references_and_bad_rows(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [
        {"dialogue": "#Person1#: Hi.\n#Person2#: Hello.", "summary": "A", "summaries": ["A", "B"]},
        {"dialogue": "#Person1#: Bye.", "summary": "C"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    examples = read_task_examples("summarize", path)
    assert [ex.references for ex in examples] == [["A", "B"], ["C"]]
    path.write_text('{"dialogue": "x"}\nnot json\n{"summary": "y"}\n')
    with pytest.raises(ss.SpecstreamError, match="line 1: .*line 2: .*line 3: "):
        read_task_examples("summarize", path)


def test_unknown_task_and_missing_file(tmp_path):
    with pytest.raises(ss.SpecstreamError, match="unknown task 'poem'"):
        get_task("poem")
    with pytest.raises(ss.SpecstreamError, match="not found"):
        read_task_examples("sql", tmp_path / "none.jsonl")
    with pytest.raises(ss.SpecstreamError, match="missing input question"):
        get_task("sql").prompt(context="CREATE TABLE t (a INT)")


def test_task_training_rows_mask_the_prompt(tiny_folders, data):
    loaded = ss.load(str(tiny_folders["llama"]))
    dataset = load_dataset(data / "sql" / "dev.jsonl", loaded.tokenizer, 512, task="sql")
    ex = dataset.examples[0]
    targets = [t for t, m in zip(ex.ids, ex.loss_mask, strict=True) if m]
    completion = loaded.tokenizer.decode(targets)
    first = read_task_examples("sql", data / "sql" / "dev.jsonl")[0]
    assert completion.strip().startswith(first.references[0][:20])
    assert "Question:" not in completion
    assert dataset.summary["task"] == "sql"
    # attribution travels with the adapter: the data set and its licence
    rows = len(read_task_examples("sql", data / "sql" / "dev.jsonl"))  # each row read
    assert dataset.summary["sources"] == {"sql dev.jsonl": rows}
    assert dataset.summary["licences"] == {"BSD-3-Clause (WikiSQL) and CC BY-SA 4.0 (Spider)": rows}


def test_quality_metrics_by_hand():
    from specstream_mlx.metrics import rouge, sql_exact_match

    # ROUGE-1: 2 of 3 unigrams shared -> P = R = F = 2/3; the better of two references counts
    scores = rouge(["the cat sat"], [["the cat ran", "a dog barked"]])
    assert scores["rouge1"] == pytest.approx(2 / 3)
    # ROUGE-Lsum: longest common subsequence per sentence, unioned over the summary's sentences
    two = rouge(["A b c. D e."], [["a x c. d e."]])
    assert two["rougeLsum"] == pytest.approx(4 / 5) and two["rouge1"] == pytest.approx(4 / 5)
    assert rouge(["x y"], [["x y"]]) == {"rouge1": 1.0, "rougeLsum": 1.0}
    assert sql_exact_match(
        ["SELECT a FROM t;", "select b from t"], [["select  a from T"], ["SELECT c FROM t"]]
    ) == pytest.approx(0.5)
