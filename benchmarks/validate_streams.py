"""Score a lossless stream adapter on a dev set exactly as `specstream train` validates: per-stream
top-1 accuracy, tau of a chain and of a top-k tree, and the rank statistics (acceptance), so that
adapters trained in different runs (or shipped) compare on the same rows. It also reports the
early-exit head's top-1 (the pruning projection's next-token guess at the pruning point: what
`--next-token-guess` feeds the streams, so a ceiling on what that option can give them).
`--oracle-guess` (adapters trained with `--next-token-guess`) gives their streams the true next
token instead of the early exit's guess: what a perfect guess would give those streams. Streams
with parent heads (`--parent-rank`) are scored as decoding drafts them: stream 1 reads the
text's next token (on the base's own answers, the main stream's greedy token), stream j stream
j - 1's best token.

    ./dev.sh python benchmarks/validate_streams.py --adapter chat --data DEV.jsonl
        [--max-length 512] [--targets text|self] [--oracle-guess] [--json OUT.json]
    ./dev.sh python benchmarks/validate_streams.py --medusa runs/medusa_X --data DEV.jsonl

`--medusa` scores Medusa-1 heads (`specstream train --mode medusa`) the same way: head j against
the token j after the next, from the base's last hidden state (full depth, 28M parameters a
head), the comparator for what the streams could reach.

DEV.jsonl: prompt/completion rows (the format `specstream train` reads; rows flagged degenerate
are skipped). `--targets self` scores against the base model's own greedy tokens.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.models.arch import arch_of  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from specstream_mlx.decoding import tree_step  # noqa: E402
from specstream_mlx.decoding.plan import best_paths  # noqa: E402
from specstream_mlx.decoding.tree_step import early_exit_guess  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.streams.acceptance import Acceptance  # noqa: E402
from specstream_mlx.training.data import load_dataset  # noqa: E402
from specstream_mlx.training.forward import base_features, stream_hidden  # noqa: E402
from specstream_mlx.training.medusa_loss import final_hidden  # noqa: E402
from specstream_mlx.training.trainer import validate, validate_streams  # noqa: E402
from specstream_mlx.baselines.medusa import load_medusa  # noqa: E402
# isort: on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--adapter", help="a lossless adapter folder or name")
    which.add_argument("--medusa", help="a Medusa heads folder (specstream train --mode medusa)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--targets", choices=["text", "self"], default="text")
    parser.add_argument(
        "--oracle-guess", action="store_true", help="the true next token as the streams' guess"
    )
    parser.add_argument("--json", help="write the validation record here")
    args = parser.parse_args()
    loaded = ss.load(args.model, adapter=args.adapter)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    val = load_dataset(args.data, loaded.tokenizer, args.max_length).examples
    score = score_medusa if args.medusa else score_streams
    record, gamma = score(args, loaded, arch, val)
    rates = record.pop("acceptance")
    record["tau_static"] = static_taus(Acceptance.from_dict(rates), gamma)
    name = args.medusa or args.adapter
    print(
        f"{name} on {len(val)} rows of {args.data} ({record['positions']} positions): "
        f"top-1 per stream (head) {record['stream_accuracy']}, NLL per stream "
        f"{record['stream_nll']}, tau chain {record['tau_chain']}, "
        f"tau top-k tree {record['tau_tree']}, tau of the best static tree "
        f"of 4 / 8 / 16 nodes {list(record['tau_static'].values())}, early-exit top-1 "
        f"{record.get('early_exit_top1')}"
    )
    if args.json:
        out = {"adapter": name, "data": args.data, "targets": args.targets, **record}
        out["oracle_guess"] = args.oracle_guess
        out.update(acceptance=rates, **provenance())
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


def score_streams(args, loaded, arch, val) -> tuple[dict, int]:
    """The lossless streams' validation record (with the early-exit head's top-1), and gamma."""
    params = loaded.streams
    if params is None or params.config.mode != "lossless":
        raise SystemExit(f"{args.adapter}: not a lossless stream adapter")
    if args.oracle_guess and not params.config.next_token_guess:
        raise SystemExit(f"{args.adapter}: --oracle-guess needs an adapter with next_token_guess")
    n_msa = params.config.n_msa_layers
    feats = [base_features(arch, n_msa, ex.ids, ex.loss_mask, args.targets) for ex in val]

    def hidden_of(i, rows):
        if not args.oracle_guess:
            return stream_hidden(arch, params, feats[i], rows)
        with true_next_token(feats[i].targets, rows):
            return stream_hidden(arch, params, feats[i], rows)

    record = asdict(validate_streams(arch, params, feats, hidden_of))
    record["early_exit_top1"] = early_exit_top1(arch, params, feats)
    return record, params.config.gamma


def score_medusa(args, loaded, arch, val) -> tuple[dict, int]:
    """Medusa heads scored like the streams (head j predicts the token j after the next, from
    the base's last hidden state): a full-depth comparator at the same rows."""
    if args.targets != "text" or args.oracle_guess:
        raise SystemExit("--medusa scores against the text only")
    heads = load_medusa(args.medusa, loaded, arch)
    hidden = [final_hidden(arch, mx.array(ex.ids)) for ex in val]

    def logits_of(i, rows):
        return heads(hidden[i][mx.array(rows)]).transpose(1, 0, 2)

    cfg = heads.config
    return asdict(validate(val, logits_of, cfg.n_heads, cfg.top_k)), cfg.n_heads


@contextmanager
def true_next_token(targets: mx.array, rows: np.ndarray):
    """While stream_hidden runs `rows`, the streams' next-token guess is the true next token
    (the guess is made inside decoding.tree_step, so it is replaced there, for this call only)."""
    real = tree_step.early_exit_guess
    nxt = targets[mx.array(np.minimum(np.asarray(rows) + 1, targets.shape[0] - 1))]
    tree_step.early_exit_guess = lambda arch, params, h: nxt
    try:
        yield
    finally:
        tree_step.early_exit_guess = real


def early_exit_top1(arch, params, feats) -> float:
    """How often the early-exit head's greedy guess is the next target token, over every
    position that predicts a completion token."""
    hits = total = 0
    for f in feats:
        rows = np.nonzero(f.loss_mask[1:])[0]  # row r predicts token r + 1
        if not len(rows):
            continue
        guess = early_exit_guess(arch, params, f.h_low[mx.array(rows)])
        hits += int((guess == f.targets[mx.array(rows) + 1]).sum().item())
        total += len(rows)
    return round(hits / max(total, 1), 4)


def static_taus(acceptance: Acceptance, gamma: int) -> dict[int, float]:
    """Expected tokens per pass of the best static tree of 4, 8 and 16 nodes (root included)
    under these statistics: the most probable rank paths, as the device's tree choice takes."""
    taus = {}
    for nodes in (4, 8, 16):
        paths = best_paths(acceptance, gamma, nodes - 1)
        taus[nodes] = round(1.0 + sum(acceptance.probability(p) for p in paths), 4)
    return taus


if __name__ == "__main__":
    try:
        main()
    except ss.SpecstreamError as exc:  # a bad adapter or data file: its message, no traceback
        raise SystemExit(f"error: {exc}") from None
