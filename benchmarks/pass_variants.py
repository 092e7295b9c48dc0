"""Two ways a speculative pass might cost less on this CPU, each timed against the code as it is
(issues 18 and 19). Neither is in the package: this script swaps them in for its own process.

- `draft-shortlist`: the streams draft from a head over a shortlist of the vocabulary (the `--k`
  commonest tokens of the task's training answers and 3 MB of WikiText-2), not the whole head; the
  main rows keep the whole head, so the output cannot change, only the drafts.
- `matmul-layout`: every `nn.Linear` but the head computes `(W @ x.T).T` instead of mlx's `x @ W.T`
  when it multiplies `--min-rows` to `--max-rows` rows (OpenBLAS packs the big operand
  differently: cheaper for some of these matrices at 2-8 rows, dearer for others; docs/BENCHMARKS.md
  "Two cheaper passes tried").

Decodes the first `--prompts` items of a suite with `ar` and with `ss` on a fixed static tree
(`--tree`, rank paths as JSON), each with and without the variant, in interleaved rounds (the
compiled traces dropped between variants); prints ms per decoded token (medians over rounds),
tau, and whether every output equals the first variant's.

    ./dev.sh python benchmarks/pass_variants.py --probe matmul-layout --adapter sql
        [--model M] [--suite sql] [--data ../shared/data/sql/dev.jsonl] [--tree '[[0],[1]]']
        [--prompts 8] [--max-tokens 64] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import specstream_mlx.decoding.passes as passes  # noqa: E402
from specstream_mlx.bench.suites import read_suite  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
# isort: on

WIKITEXT_CHARS = 3_000_000


class Shortlist:
    """Stream drafts from the head's rows of `ids` only (passes._heads and top_k_ids swapped)."""

    def __init__(self, ids: list[int]):
        self.ids, self.on, self.weight = mx.array(sorted(ids)), False, None
        self._heads, self._top_k = passes.Passes._heads, passes.top_k_ids
        shortlist = self
        passes.Passes._heads = lambda owner, *a: shortlist.heads(owner, *a)
        passes.top_k_ids = self.top_k

    def heads(self, owner, main, streams, drafted):
        if not self.on or not drafted:
            return self._heads(owner, main, streams, drafted)
        arch = owner.arch
        if self.weight is None:  # (d, K): the head's columns of the shortlisted tokens
            self.weight = mx.take(arch.lm_head(mx.eye(main.shape[-1])), self.ids, axis=1)
            mx.eval(self.weight)
        n = streams.shape[0]
        rows = arch.norm(streams[:, :drafted].reshape(n * drafted, -1)) @ self.weight
        return arch.lm_head(main), rows.reshape(n, drafted, -1)

    def top_k(self, logits, k):
        best = self._top_k(logits, k)
        return self.ids[best] if logits.shape[-1] == self.ids.shape[0] else best


class Layout:
    """nn.Linear as (W @ x.T).T for `rows` in [low, high] and at most `max_out` outputs."""

    def __init__(self, low: int, high: int, max_out: int):
        self.low, self.high, self.max_out, self.on = low, high, max_out, False
        self._call = nn.Linear.__call__
        layout = self

        def call(linear, x):
            w = linear["weight"]
            rows = math.prod(x.shape[:-1])
            few = layout.low <= rows <= layout.high and w.shape[0] <= layout.max_out
            if not (layout.on and few):
                return layout._call(linear, x)
            y = (w @ x.reshape(rows, x.shape[-1]).T).T.reshape(*x.shape[:-1], w.shape[0])
            return y + linear["bias"] if "bias" in linear else y

        nn.Linear.__call__ = call


def shortlist_ids(tokenizer, train: Path, k: int) -> list[int]:
    counts = collections.Counter()
    for line in train.open():
        row = json.loads(line)
        counts.update(tokenizer.encode(row.get("answer") or row.get("summary") or ""))
    wiki = Path("../shared/data/wikitext2/train.txt").read_text()[:WIKITEXT_CHARS]
    counts.update(tokenizer.encode(wiki))
    return [t for t, _ in counts.most_common(k)]


def decode_all(loaded, questions, decoder: str, max_tokens: int) -> tuple[float, float, list]:
    """ms per decoded token (prefill excluded), tau, the texts."""
    ms, tokens, passes_run, texts = 0.0, 0, 0, []
    for q in questions:
        messages = [{"role": "user", "content": q.turns[0]}]
        chunks = list(
            ss.stream_generate(
                loaded, messages, max_tokens=max_tokens, decoder=decoder, tree="adapter"
            )
        )
        stats = chunks[-1].stats
        ms += (stats.wall_seconds - stats.prompt_seconds) * 1000
        tokens += stats.generated_tokens
        passes_run += stats.forward_passes
        texts.append("".join(c.text for c in chunks))
    return ms / tokens, tokens / passes_run, texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", choices=("draft-shortlist", "matmul-layout"), required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--adapter", default="sql")
    p.add_argument("--suite", default="sql")
    p.add_argument("--data", default="../shared/data/sql/dev.jsonl")
    p.add_argument("--train", default="../shared/data/sql/train.jsonl", help="shortlist source")
    p.add_argument("--tree", default="[[0],[1]]")
    p.add_argument("--k", type=int, default=16384, help="shortlist size")
    p.add_argument("--min-rows", type=int, default=2)
    p.add_argument("--max-rows", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    loaded = ss.load(args.model, adapter=args.adapter)
    tree = tuple(tuple(path) for path in json.loads(args.tree))
    loaded.streams.config = dataclasses.replace(loaded.streams.config, tree=tree)
    loaded.streams.acceptance = None  # the tree above, not the calibrated one
    if args.probe == "draft-shortlist":
        variant = Shortlist(shortlist_ids(loaded.tokenizer, Path(args.train), args.k))
    else:
        variant = Layout(args.min_rows, args.max_rows, max_out=16384)  # not the head
    questions = read_suite(args.suite, args.data, args.prompts)
    first, ms, taus, same = None, collections.defaultdict(list), {}, {}
    for round_ in range(args.rounds):
        for decoder in ("ar", "ss"):
            for on in (False, True):
                variant.on = on
                for owner in loaded.passes.values():
                    owner._fns.clear()  # a trace holds the variant it was built with
                name = f"{decoder}{' + ' + args.probe if on else ''}"
                start = time.perf_counter()
                per_token, tau, texts = decode_all(loaded, questions, decoder, args.max_tokens)
                first = first or texts
                ms[name].append(per_token)
                taus[name] = tau
                same[name] = sum(a == b for a, b in zip(texts, first, strict=True))
                print(
                    f"round {round_} {name}: {per_token:.1f} ms/token, tau {tau:.3f}, "
                    f"{same[name]}/{len(first)} outputs as the first "
                    f"({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
    base = statistics.median(ms["ar"])
    rows = {
        name: {
            "ms_per_token": round(statistics.median(v), 2),
            "speed_vs_ar": round(base / statistics.median(v), 3),
            "tau": round(taus[name], 3),
            "outputs_as_first": same[name],
        }
        for name, v in ms.items()
    }
    for name, row in rows.items():
        print(name, row)
    if args.json:
        out = {"args": vars(args), "rows": rows, "rounds_ms": ms, "provenance": provenance()}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
