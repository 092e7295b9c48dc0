"""CUDA validation of the PyTorch path: Speculative Streaming against Hugging Face greedy
generation (`model.generate`, do_sample=False) on the same GPU, over the same prompts, in the
bench JSON schema (specstream_mlx/bench/report.py), with the markdown table printed.

    python -m convert.validate_cuda --adapter chat --prompts prompts.jsonl --out cuda.json

Methods: `ar` is transformers' greedy `generate` (the plain decoding this device gets from the
library users already have); `ss` and `ss+pld` are this path's tree decoder. `identical_to_ar`
compares each method's tokens with the exact reference of the adapter's mode: `ar` for a
lossless adapter (frozen base), and for a shared-mode one (LoRA, main stream attending to its
streams) the same model decoding one token per pass (`ss-plain`), since generate() does not run
the streams. Runs on the CPU too (--device cpu), where it is a correctness check, not a speed one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import torch

from specstream_mlx.bench.report import markdown
from specstream_mlx.decoding.lookup import LookupConfig
from specstream_mlx.decoding.plan import Acceptance, best_paths
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.errors import SpecstreamError
from specstream_mlx.jsonl import read_rows
from specstream_mlx.sampling_params import SamplingParams

from .torch_adapter import load_torch_adapter
from .torch_base import TorchBase, load_base
from .torch_streams import decode_until_eos, speculative_decode

SHIPPED = Path(__file__).resolve().parent.parent / "specstream_mlx" / "adapters"


@dataclass
class Sample:
    tokens: list[int]
    seconds: float
    passes: int
    peak_mb: float | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(base: TorchBase, run) -> Sample:
    device = base.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    start = time.perf_counter()
    tokens, passes = run()
    _sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return Sample(tokens, seconds, passes, peak)


def hf_generate(base: TorchBase, prompt_ids: list[int], max_tokens: int, sampling=None):
    """transformers' generate, greedy (or sampling at `sampling.temperature` with its top-k /
    top-p); stops at EOS like the speculative decoder."""
    from transformers import GenerationConfig

    # An explicit config: a model's own generation_config may carry a repetition penalty or
    # other settings that make generate() something other than plain greedy decoding.
    sampled = sampling is not None and not sampling.greedy
    extra = {}
    if sampled:
        extra = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=sampled,
        **extra,
        eos_token_id=sorted(base.eos_token_ids),
        pad_token_id=base.tokenizer.pad_token_id or sorted(base.eos_token_ids)[0],
    )
    if sampled and sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    ids = torch.as_tensor([prompt_ids], device=base.device)
    with torch.inference_mode():
        out = base.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config
        )
    tokens = out[0, len(prompt_ids) :].tolist()
    return tokens, len(tokens)


def read_prompts(path: str | None, limit: int) -> list[tuple[str, str]]:
    """(category, prompt) pairs: a jsonl file of {"prompt"[, "category"]} rows, or by default the
    chat suite's held-out mix from ../shared/data (SPECSTREAM_DATA)."""
    if path:

        def row(r):
            if not isinstance(r, dict) or not isinstance(r.get("prompt"), str):
                raise ValueError('needs a "prompt" string')
            return (str(r.get("category", "all")), r["prompt"])

        return read_rows(path, row, "prompt file")[:limit]
    from specstream_mlx.training.chat_prompts import build_chat_mix

    data = Path(os.environ.get("SPECSTREAM_DATA", Path(__file__).parents[2] / "shared" / "data"))
    if not data.is_dir():
        raise SpecstreamError(f"no --prompts file and no data folder at {data} (SPECSTREAM_DATA)")
    return build_chat_mix(data, limit, seed=1, split="dev")


def sized_tree(folder: Path, cfg, nodes: int) -> tuple[TreePolicy, str]:
    """A draft tree of `nodes` nodes, root included, and how it was made: the most probable
    rank paths of the adapter's acceptance statistics (the static tree the MLX runtime's
    planner picks among, decoding/plan.py), or without them every stream's top 3 cut to the
    size by the early-exit head."""
    acceptance = Acceptance.read(folder)
    if acceptance is not None and acceptance.gamma == cfg.gamma:
        paths = best_paths(acceptance, cfg.gamma, nodes - 1)
        return TreePolicy.static(paths), f"{len(paths) + 1} nodes: acceptance.json's best paths"
    policy = TreePolicy(3, nodes, 0.0, cfg.gamma)
    return policy, f"{nodes} nodes: top 3 of every stream, pruned"


def validate(
    base: TorchBase,
    adapter: str,
    prompts,
    max_tokens: int,
    log=print,
    sampling=None,
    trees: tuple[int, ...] = (),
) -> dict:
    """With `sampling` (a temperature), every method samples (transformers' generate with
    do_sample, the tree decoder by rejection sampling) and outputs are not compared. `trees`:
    node counts N, each adding `ss@N` and `ss+pld@N`, drafting a tree of N nodes instead of the
    adapter's own (sized_tree): on a GPU a pass of many nodes costs about what one of two does,
    so the tree that pays there is larger than the one an adapter keeps for a CPU."""
    folder = Path(adapter) if Path(adapter).exists() else SHIPPED / adapter
    streams = load_torch_adapter(folder, base)
    cfg = streams.config
    eos = base.eos_token_ids

    def ss(ids, **kw):
        steps = speculative_decode(base.model, streams, ids, max_tokens, sampling=sampling, **kw)
        return decode_until_eos(steps, eos)

    methods = {
        # a shared-mode adapter's LoRA is on the model: generate() is then the timing baseline
        "ar": lambda ids: hf_generate(base, ids, max_tokens, sampling),
        "ss": ss,
        "ss+pld": lambda ids: ss(ids, lookup=LookupConfig()),
    }
    sized = {n: sized_tree(folder, cfg, n) for n in trees}
    for n, (policy, _) in sized.items():
        methods[f"ss@{n}"] = lambda ids, p=policy: ss(ids, policy=p)
        methods[f"ss+pld@{n}"] = lambda ids, p=policy: ss(ids, policy=p, lookup=LookupConfig())
    if cfg.main_needs_streams:  # plain decoding runs the streams the main stream reads
        methods["ss-plain"] = lambda ids: ss(ids, draft=False)
    reference = "ss-plain" if cfg.main_needs_streams else "ar"
    sampled = sampling is not None and not sampling.greedy
    encoded = [(c, base.encode_chat(p)) for c, p in prompts]
    for run in methods.values():  # warm-up: CUDA kernels, allocator
        run(encoded[0][1][:16])
    samples = {name: [] for name in methods}
    for i, (_, ids) in enumerate(encoded):
        for name, run in methods.items():
            samples[name].append(_timed(base, lambda run=run, ids=ids: run(ids)))
        log(
            f"[{i + 1}/{len(encoded)}] "
            + ", ".join(f"{n} {samples[n][-1].seconds:.3f}s" for n in methods)
        )
    extra = sum(p.numel() for p in streams.parameters())
    if cfg.mode == "shared":
        extra += sum(p.numel() for n, p in base.model.named_parameters() if "lora_" in n)
    rows = []
    for name in methods:
        row = {"name": name, "adapter": adapter if name != "ar" else None}
        compare = name == reference or sampled
        row.update(_summary(samples[name], samples["ar"], samples[reference], compare))
        row["extra_params"] = 0 if name == "ar" else extra
        peaks = [s.peak_mb for s in samples[name] if s.peak_mb is not None]
        row["peak_memory_mb"] = round(max(peaks), 1) if peaks else None
        row["per_category"] = {}
        for c in sorted({c for c, _ in encoded}):
            idx = [i for i, (cc, _) in enumerate(encoded) if cc == c]

            def pick(xs, idx=idx):
                return [xs[i] for i in idx]

            row["per_category"][c] = _summary(
                pick(samples[name]), pick(samples["ar"]), pick(samples[reference]), compare
            )
        rows.append(row)
    return {
        "suite": "cuda-validation",
        "machine": machine(base),
        "config": {
            "suite": "cuda-validation",
            "data": "prompts",
            "limit": len(prompts),
            "max_tokens": max_tokens,
            "methods": list(methods),
            "adapter": adapter,
            "temp": 0.0 if not sampled else sampling.temperature,
            "model": base.name,
            "precision": str(next(base.model.parameters()).dtype).replace("torch.", ""),
            "reference": reference,
            "medusa": None,
            "lora": None,
            "tokens_per_second": "generated tokens / wall seconds, prefill included",
            "trees": {f"ss@{n}": how for n, (_, how) in sized.items()},
        },
        "methods": rows,
        "unavailable": {},
    }


def _summary(samples, ar, reference, not_compared: bool) -> dict:
    passes = sum(s.passes for s in samples)
    tokens = sum(len(s.tokens) for s in samples)
    seconds = sum(s.seconds for s in samples)
    identical = sum(s.tokens == r.tokens for s, r in zip(samples, reference, strict=True))
    return {
        "speedup_vs_ar": round(
            statistics.median(a.seconds / s.seconds for a, s in zip(ar, samples, strict=True)), 3
        ),
        "tokens_per_second": round(tokens / seconds, 2) if seconds else 0.0,
        "mean_accepted_tokens": round(tokens / passes, 3) if passes else 0.0,
        "forward_passes": passes,
        "quality": {},
        "identical_to_ar": None if not_compared else round(identical / len(samples), 4),
        "prefill_seconds": None,
        "decode_seconds": round(seconds, 3),
        "generated_tokens": tokens,
        "samples": len(samples),
    }


def machine(base: TorchBase) -> dict:
    device = base.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "platform": platform.platform(),
        "processor": name,
        "python": platform.python_version(),
        "backend": f"torch {device.type}",
        "blas": "-",
        "mlx": "-",
        "mlx_lm": "-",
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "peft": version("peft"),
        "cuda": torch.version.cuda,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m convert.validate_cuda", description=__doc__)
    p.add_argument("--model", default=None, help="HF folder, hub id or .gguf (default: SmolLM2)")
    p.add_argument(
        "--adapter", default="chat", help="adapter folder (torch or MLX) or shipped name"
    )
    p.add_argument("--prompts", default=None, help='jsonl of {"prompt"} (default: the chat mix)')
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument(
        "--trees", default="", help="node counts N,N,...: also ss@N and ss+pld@N (sized_tree)"
    )
    args = p.parse_args(argv)
    try:
        try:
            trees = tuple(int(n) for n in args.trees.split(",") if n.strip())
        except ValueError:
            raise SpecstreamError(f"--trees: node counts like 4,8,16, not {args.trees!r}") from None
        if any(n < 2 for n in trees):
            raise SpecstreamError("--trees: a tree has at least 2 nodes (the root and a draft)")
        if args.limit < 1 or args.max_tokens < 1:
            raise SpecstreamError("--limit and --max-tokens must be >= 1")
        if args.out and not Path(args.out).resolve().parent.is_dir():
            raise SpecstreamError(f"--out: no folder {Path(args.out).parent}")
        sampling = SamplingParams(args.temp, args.top_p, args.top_k, args.seed)
        base = load_base(args.model, device=args.device, dtype=args.dtype)
        prompts = read_prompts(args.prompts, args.limit)
        result = validate(
            base, args.adapter, prompts, args.max_tokens, sampling=sampling, trees=trees
        )
    except SpecstreamError as exc:
        print(f"validate_cuda: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(result))
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
