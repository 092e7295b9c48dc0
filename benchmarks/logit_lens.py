"""How much of the next token does the frozen base know at each layer? The base head (final norm
and LM head) read off the main stream after every block (the "logit lens"), scored against the
next token of distilled answers, and with `--adapter` the trained early-exit head (the pruning
projection) at the adapter's pruning point. A stream that enters at layer N - N_s must guess
tokens t + 2.. from a state that names token t + 1 only this often: a ceiling on what the
streams, and `--next-token-guess`, can start from (issue 20).

    ./dev.sh python benchmarks/logit_lens.py --data DEV.jsonl [--rows 100] [--adapter chat]
        [--json docs/results/logit_lens.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from specstream_mlx.decoding.tree_step import early_exit_guess  # noqa: E402
from specstream_mlx.models.arch import arch_of  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402
from specstream_mlx.training.data import load_dataset  # noqa: E402
# isort: on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="prompt/completion rows (distilled answers)")
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--adapter", help="a lossless adapter: also score its early-exit head")
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", help="write the record here")
    args = parser.parse_args()
    loaded = ss.load(args.model, adapter=args.adapter)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    examples = load_dataset(args.data, loaded.tokenizer, 512).examples[: args.rows]
    n_layers, params = len(arch.layers), loaded.streams
    hits, early, total = np.zeros(n_layers + 1), 0, 0
    for ex in examples:
        rows = np.nonzero(np.asarray(ex.loss_mask, bool)[1:])[0]  # row r predicts token r + 1
        if not len(rows):
            continue
        ids, r = mx.array(ex.ids), mx.array(rows)
        target = ids[r + 1]
        h = arch.embed(ids[None])
        for i, layer in enumerate(arch.layers):
            h = layer(h, "causal", None)
            guess = mx.argmax(arch.lm_head(arch.norm(h[0, r])), axis=-1)
            hits[i + 1] += (guess == target).sum().item()
            if params is not None and i + 1 == n_layers - params.config.n_msa_layers:
                early += (early_exit_guess(arch, params, h[0, r]) == target).sum().item()
        total += len(rows)
    record = {
        "data": args.data,
        "rows": len(examples),
        "positions": total,
        "top1_after_block": {k: round(hits[k] / total, 4) for k in range(1, n_layers + 1)},
    }
    if params is not None:
        record["adapter"] = args.adapter
        record["pruning_point"] = n_layers - params.config.n_msa_layers
        record["early_exit_top1"] = round(early / total, 4)
    print(json.dumps({k: v for k, v in record.items() if k != "top1_after_block"}))
    print("top-1 of the base head after block k:", record["top1_after_block"])
    if args.json:
        record.update(provenance())
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
