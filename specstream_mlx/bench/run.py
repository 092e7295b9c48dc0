"""Run a benchmark: every method on the same prompts, interleaved per prompt (A B C, A B C, ...)
so machine drift cancels, then one report in the documented JSON schema (bench/report.py)."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version

from ..backend import device_name, preload_blas
from ..errors import SpecstreamError
from ..prompts import encode_prompt
from ..provenance import provenance
from ..sampling import SamplingParams
from .methods import UNAVAILABLE, Method, Sample, check_methods, make_methods
from .suites import SUITES, Question, read_suite


@dataclass
class BenchConfig:
    suite: str
    data: str
    limit: int | None = None
    max_tokens: int = 128
    methods: tuple[str, ...] = ("ar", "ss", "pld", "mlx-lm")
    adapter: str | None = None  # default: the suite's shipped adapter
    temp: float = 0.0
    model: str | None = None
    precision: str = "auto"
    medusa: str | None = None  # trained Medusa heads, for the medusa method
    lora: str | None = None  # a next-token LoRA adapter folder, for the lora method
    tree: str = "auto"  # auto: the tree chosen for this device; adapter: the adapter's own


@dataclass
class Turn:
    """One prompt (a question's turn) and every method's sample on it."""

    category: str
    references: list[str] | None
    samples: dict[str, Sample]


def run_bench(
    config: BenchConfig,
    log: Callable[[str], None] = lambda s: None,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> dict:
    """Every method on every prompt; `log` gets a line per question, `progress` (questions
    done, total) drives a progress bar."""
    import specstream_mlx as ss

    check_methods(list(config.methods), config.medusa, config.lora)
    questions = read_suite(config.suite, config.data, config.limit)
    if config.max_tokens < 1:
        raise SpecstreamError(f"max_tokens must be >= 1, got {config.max_tokens}")
    loaded = ss.load(config.model, adapter=config.adapter, precision=config.precision)
    adapter = config.adapter or _shipped_adapter(config, loaded, log)
    if adapter is not None and loaded.adapter is None:
        ss.use_adapter(loaded, adapter)
    shared = loaded.streams is not None and loaded.streams.config.mode == "shared"
    base = ss.load(config.model, precision=config.precision) if shared else loaded
    methods = make_methods(list(config.methods), loaded, base, config.medusa, config.lora)
    for method in methods:
        method.tree = config.tree
    sampling = SamplingParams(temperature=config.temp, seed=0)

    first = encode_prompt(loaded, questions[0].turns[0])
    for method in methods:  # warm-up: compile-free, but first calls allocate and load code
        method.run(first, 4, sampling)
    turns = []
    for number, question in enumerate(questions, start=1):
        turns += _run_question(question, methods, loaded, config.max_tokens, sampling)
        log(f"{number}/{len(questions)} {question.category}: " + _progress(turns, methods))
        progress(number, len(questions))
    out = report(config, adapter, methods, turns)
    out["stream_acceptance"] = _stream_acceptance(config, loaded, questions, log)
    return out


def _stream_acceptance(config: BenchConfig, loaded, questions, log) -> dict | None:
    """Where streams draft (ss, ss+pld; greedy): their hit rates on this run's prompts, from
    one more greedy decode of each prompt's first turn with the streams probed."""
    from ..calibration import measure_acceptance

    if not {"ss", "ss+pld"} & set(config.methods) or config.temp > 0 or loaded.streams is None:
        return None
    prompts = [encode_prompt(loaded, q.turns[0]) for q in questions]
    source = f"greedy decoding of the {len(prompts)} prompts of this run"
    log(f"stream acceptance: decoding the {len(prompts)} prompts once more, probed")
    return measure_acceptance(loaded, loaded.streams, prompts, config.max_tokens, source).rates()


def _shipped_adapter(config: BenchConfig, loaded, log: Callable[[str], None]) -> str | None:
    """The suite's shipped adapter, where `ss` runs and it was made for this model."""
    from ..streams.adapter_io import made_for

    name = SUITES[config.suite][1]
    if not {"ss", "ss+pld"} & set(config.methods):
        return None
    if made_for(name, loaded):
        return name
    log(f"the shipped {name} adapter was made for another model: ss drafts with untrained streams")
    return None


def _run_question(question: Question, methods: list[Method], loaded, max_tokens, sampling):
    """Each turn continues the conversation with the reference decoder's (ar's) answers, so
    every method sees the same prompt."""
    history, out = [], []
    for text in question.turns:
        messages = history + [{"role": "user", "content": text}]
        prompt_ids = encode_prompt(loaded, messages)
        samples = {m.name: m.run(prompt_ids, max_tokens, sampling) for m in methods}
        out.append(Turn(question.category, question.references, samples))
        history = messages + [{"role": "assistant", "content": samples["ar"].text}]
    return out


def _progress(turns: list[Turn], methods: list[Method]) -> str:
    parts = []
    for m in methods[1:]:
        ratio = statistics.median(
            t.samples["ar"].wall_seconds / t.samples[m.name].wall_seconds for t in turns
        )
        parts.append(f"{m.name} {ratio:.2f}x")
    return ", ".join(parts)


def _quality(suite: str, outputs: list[str], references: list[list[str]]) -> dict:
    from ..metrics import rouge, sql_exact_match

    task = SUITES[suite][0]
    if task is None:
        return {}
    if task == "sql":
        return {"exact_match": round(sql_exact_match(outputs, references), 4)}
    return {k: round(v, 4) for k, v in rouge(outputs, references).items()}


def _summary(suite: str, name: str, turns: list[Turn], sampled: bool = False) -> dict:
    """One method's figures over `turns`; sampled runs are not compared token by token with ar
    (two samples of one distribution need not be equal): identical_to_ar is None."""
    samples = [t.samples[name] for t in turns]
    refs = [t.samples["ar"] for t in turns]
    decode = sum(s.decode_seconds for s in samples)
    decode_tokens = sum(max(len(s.token_ids) - 1, 0) for s in samples)
    passes = sum(s.forward_passes for s in samples)
    quality = {}
    if turns[0].references is not None:
        quality = _quality(suite, [s.text for s in samples], [t.references for t in turns])
    return {
        "speedup_vs_ar": round(
            statistics.median(
                r.wall_seconds / s.wall_seconds for r, s in zip(refs, samples, strict=True)
            ),
            3,
        ),
        "tokens_per_second": round(decode_tokens / decode, 2) if decode > 0 else 0.0,
        "mean_accepted_tokens": round(sum(s.accepted_tokens for s in samples) / passes, 3),
        "forward_passes": passes,
        "quality": quality,
        "identical_to_ar": None
        if name == "ar" or sampled
        else round(
            sum(s.token_ids == r.token_ids for r, s in zip(refs, samples, strict=True))
            / len(turns),
            4,
        ),
        "prefill_seconds": round(sum(s.prefill_seconds for s in samples), 3),
        "decode_seconds": round(decode, 3),
        "generated_tokens": sum(len(s.token_ids) for s in samples),
        "samples": len(samples),
    }


def report(
    config: BenchConfig, adapter: str | None, methods: list[Method], turns: list[Turn]
) -> dict:
    categories = sorted({t.category for t in turns})
    rows = []
    for m in methods:
        sampled = config.temp > 0
        row = {"name": m.name, "adapter": m.adapter}
        row.update(_summary(config.suite, m.name, turns, sampled))
        row["extra_params"] = m.extra_params
        row["peak_memory_mb"] = round(max(t.samples[m.name].peak_memory_mb for t in turns), 1)
        trees = [t.samples[m.name].tree for t in turns if t.samples[m.name].tree is not None]
        row["tree"] = trees[0] if trees else None  # chosen once per run
        # what actually ran (a lossless ss whose calibrated tree is empty decodes as ar)
        row["ran"] = sorted({t.samples[m.name].ran for t in turns})
        row["per_category"] = {
            c: _summary(config.suite, m.name, [t for t in turns if t.category == c], sampled)
            for c in categories
        }
        rows.append(row)
    return {
        "suite": config.suite,
        "machine": machine(),
        "provenance": provenance(),
        "config": {**asdict(config), "methods": list(config.methods), "adapter": adapter},
        "methods": rows,
        "unavailable": UNAVAILABLE,
    }


def machine() -> dict:
    blas = preload_blas()
    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "python": platform.python_version(),
        "backend": device_name(),
        "blas": blas.library or blas.reason,
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
    }
