"""`specstream train`: train a stream adapter (lossless or shared mode) on jsonl data."""

from __future__ import annotations

import sys

from .args import (
    TASK_NAMES,
    add_model_args,
    non_negative_int,
    output_folder,
    positive_float,
    positive_int,
)
from .progress import Progress, shows_bar

HELP = "train a speculative-stream adapter"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help=HELP, description=HELP)
    p.add_argument(
        "--data",
        required=True,
        help="training jsonl: messages, prompt+completion or text rows (loss on completions "
        "only); with --task, a data file in the shape of ../shared/data",
    )
    p.add_argument(
        "--task",
        choices=TASK_NAMES,
        default=None,
        help="read --data/--val as DialogSum jsonl, E2E csv or sql-create-context jsonl, with "
        "the prompt template of that writing tool",
    )
    p.add_argument("--val", default=None, help="validation jsonl (default: the last 5%% of --data)")
    p.add_argument("--out", required=True, help="adapter folder to write")
    p.add_argument(
        "--mode",
        choices=["lossless", "shared", "next-token", "medusa"],
        default="lossless",
        help="lossless: frozen base, streams only (output unchanged); shared: LoRA in every "
        "layer shared by main stream and streams, the main stream attends to its streams "
        "(fine-tunes the model for the task); next-token: the same LoRA layers on next-token "
        "loss alone, no streams (the paper's baseline; writes an mlx-lm LoRA adapter folder); "
        "medusa: Medusa-1 heads on the frozen base (the comparator of `specstream bench`)",
    )
    add_model_args(p)
    p.add_argument("--gamma", type=positive_int, default=4, help="streams, or medusa heads")
    p.add_argument("--msa-layers", type=positive_int, default=4)
    p.add_argument("--tree-top-k", type=positive_int, default=3)
    p.add_argument("--rank", type=positive_int, default=8, help="stream adapter rank")
    p.add_argument(
        "--no-stream-adapters",
        action="store_true",
        help="shared: the streams learn through the shared LoRA alone (no adapters of their own)",
    )
    p.add_argument(
        "--main-ignores-streams",
        action="store_true",
        help="shared: the main stream does not attend to the streams, so `ss` decodes exactly "
        "the model with the LoRA alone (the LoRA still learns from the streams' loss too; to "
        "keep a trained LoRA's answers, see scripts/pack_lora_streams.py)",
    )
    p.add_argument(
        "--next-token-guess",
        action="store_true",
        help="the streams also start from the early-exit head's guess for the next token (its "
        "embedding through a learned projection): stream 1 then predicts the token after a "
        "known one. Costs one head pass on the stream nodes per decoding pass",
    )
    p.add_argument(
        "--attention-adapters",
        action="store_true",
        help="the streams' adapters act on the attention path too: a second low-rank adapter "
        "per MSA layer on the stream rows' attention input (what they attend to, and carry)",
    )
    p.add_argument(
        "--parent-rank",
        type=non_negative_int,
        default=0,
        help="each stream gets a parent head of this rank after the MSA layers, which reads "
        "the token before its target (stream 1: the main stream's own next token; stream j: "
        "stream j-1's guess). Costs one head pass per drafted stream, in turn. 0 = none",
    )
    p.add_argument(
        "--from",
        dest="from_adapter",
        default=None,
        metavar="ADAPTER",
        help="with --parent-rank: train only parent heads on this trained adapter's streams "
        "(frozen with its LoRA, their states computed once per sequence); the adapter's mode "
        "and settings replace --mode, --gamma, --msa-layers, --lora-rank and the rest",
    )
    p.add_argument(
        "--draft-vocab",
        type=non_negative_int,
        default=0,
        metavar="K",
        help="the streams draft from the K commonest target tokens of --data only: their head "
        "pass reads K of the head's columns (decoding stays lossless; a token outside is never "
        "drafted). 0 = the whole vocabulary",
    )
    p.add_argument(
        "--lora-rank", type=positive_int, default=8, help="LoRA rank (shared, next-token)"
    )
    p.add_argument("--lora-scale", type=float, default=20.0, help="LoRA scale (shared, next-token)")
    p.add_argument(
        "--lora-layers",
        type=non_negative_int,
        default=0,
        help="shared, next-token: train the LoRA of the top N blocks only (at least the MSA "
        "layers in shared mode); the blocks below run once per sequence and their output is "
        "cached, so a step runs N blocks instead of all. 0 = every block (default)",
    )
    p.add_argument("--steps", type=positive_int, default=200)
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--lr", type=positive_float, default=5e-4, help="streams and pruning projection")
    p.add_argument(
        "--lora-lr", type=positive_float, default=5e-5, help="LoRA layers (shared, next-token)"
    )
    p.add_argument("--warmup", type=positive_int, default=10)
    p.add_argument("--max-length", type=positive_int, default=512)
    p.add_argument(
        "--segment",
        type=non_negative_int,
        default=64,
        help="lossless, medusa: positions per sequence per step (a random run of them; bounds "
        "memory); 0 = all",
    )
    p.add_argument(
        "--targets",
        choices=["text", "self", "soft"],
        default="text",
        help="lossless: the streams learn the text's tokens (text), or the base model's own greedy "
        "predictions on the text (self: what decoding accepts, on any text), or those and the "
        "base's distribution for each token (soft: knowledge distillation, top 32 tokens)",
    )
    p.add_argument("--val-every", type=positive_int, default=50)
    p.add_argument("--checkpoint-every", type=positive_int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing adapter folder")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar or per-step lines (validations and the summary still print)",
    )
    p.set_defaults(run=run)


def step_progress(bar: Progress):
    """train's on_step callback: steps, loss and tokens/s on the bar."""
    totals = {"tokens": 0, "seconds": 0.0}

    def on_step(report) -> None:
        totals["tokens"] += report.tokens
        totals["seconds"] += report.seconds
        bar.update(
            report.step,
            report.steps,
            first=report.step - 1,
            loss=f"{report.loss:.3f}",
            tokens_s=f"{totals['tokens'] / totals['seconds']:.0f}",
        )

    return on_step


def with_parent_heads(loaded, adapter: str, rank: int):
    """A trained adapter's streams with new parent heads of `rank` (replacing any it had), its
    LoRA put on the model (shared mode: unfused, as training needs it), and the record of how
    it was made (its data's sources and licences)."""
    import json
    from dataclasses import replace

    from mlx.utils import tree_flatten, tree_unflatten

    from specstream_mlx.errors import SpecstreamError
    from specstream_mlx.streams.adapter_io import CONFIG, read_adapter, resolve_adapter
    from specstream_mlx.streams.lora import apply_lora, load_lora_weights
    from specstream_mlx.streams.params import StreamParams

    read = read_adapter(adapter, loaded)
    streams = read.streams
    if streams is None:
        raise SpecstreamError(f"--from {adapter}: not a stream adapter")
    if streams.config.mode == "shared":
        apply_lora(loaded.model, streams.config.lora_rank, streams.config.lora_scale)
        load_lora_weights(loaded.model, read.lora)
    changes = dict(parent_rank=rank, tree=None, lora_blocks=None, draft_vocab=None)
    config = replace(streams.config, **changes)
    params = StreamParams(config, loaded.config["hidden_size"])
    own = tree_flatten(streams.parameters())
    params.update(tree_unflatten([(k, v) for k, v in own if not k.startswith("parent_heads")]))
    record = json.loads((resolve_adapter(adapter, loaded) / CONFIG).read_text())
    return params, {"adapter": str(adapter), "training": record.get("training")}


def run(args) -> int:
    from dataclasses import replace
    from pathlib import Path

    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import save_adapter, save_lora_adapter
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.lora import apply_lora
    from specstream_mlx.streams.params import StreamParams
    from specstream_mlx.training.data import load_dataset
    from specstream_mlx.training.history import loss_curve
    from specstream_mlx.training.trainer import Checkpoint, Hooks, TrainConfig, train

    out = Path(args.out)
    if args.targets != "text" and args.mode != "lossless":
        raise ss.SpecstreamError(
            f"--targets {args.targets} is for --mode lossless, not {args.mode}"
        )
    if args.from_adapter and not args.parent_rank:
        raise ss.SpecstreamError("--from trains parent heads: it needs --parent-rank")
    if args.main_ignores_streams and args.from_adapter:
        raise ss.SpecstreamError("--main-ignores-streams: --from keeps the adapter's own setting")
    if args.main_ignores_streams and args.mode != "shared":
        raise ss.SpecstreamError(f"--main-ignores-streams is for --mode shared, not {args.mode}")
    for given, name in ((args.parent_rank, "--parent-rank"), (args.draft_vocab, "--draft-vocab")):
        if given and args.mode not in ("lossless", "shared"):
            raise ss.SpecstreamError(f"{name} is for stream adapters, not --mode {args.mode}")
    output_folder(args.out, "--out", args.overwrite)
    loaded = ss.load(args.model, precision=args.precision)
    data = load_dataset(args.data, loaded.tokenizer, args.max_length, args.task)
    if args.val:
        val = load_dataset(args.val, loaded.tokenizer, args.max_length, args.task).examples
    else:
        n_val = min(max(len(data) // 20, 1), 32)
        if len(data) - n_val < 1:
            raise ss.SpecstreamError("too few examples to hold some out: pass --val")
        val = data.hold_out(n_val)
    baseline = args.mode == "next-token"  # no streams: LoRA layers alone
    params = heads = streams_from = None
    if args.mode == "medusa":
        from specstream_mlx.baselines.medusa import MedusaConfig, new_heads
        from specstream_mlx.models.arch import arch_of

        config = MedusaConfig(args.gamma, args.tree_top_k, args.gamma + 1)
        heads = new_heads(loaded, arch_of(loaded.model, loaded.config["model_type"]), config)
    elif args.from_adapter:
        params, streams_from = with_parent_heads(loaded, args.from_adapter, args.parent_rank)
    elif not baseline:
        stream_config = StreamConfig(
            gamma=args.gamma,
            n_msa_layers=args.msa_layers,
            top_k=args.tree_top_k,
            stream_adapter_rank=args.rank,
            mode=args.mode,
            lora_rank=args.lora_rank,
            lora_scale=args.lora_scale,
            shared_stream_adapters=not args.no_stream_adapters,
            main_reads_streams=not args.main_ignores_streams,
            next_token_guess=args.next_token_guess,
            attention_adapters=args.attention_adapters,
            parent_rank=args.parent_rank,
        ).validate(loaded.config["num_hidden_layers"])
        params = StreamParams(stream_config, loaded.config["hidden_size"])
    vocab = _draft_vocab(args, params, data, loaded) if args.draft_vocab else None
    if args.mode in ("shared", "next-token") and not args.from_adapter:
        apply_lora(loaded.model, args.lora_rank, args.lora_scale)
    cfg = TrainConfig(
        lora_layers=args.lora_layers,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup=args.warmup,
        val_every=args.val_every,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        segment=args.segment,
        lora_learning_rate=args.lora_lr,
        targets=args.targets,
        parents_only=bool(args.from_adapter),
    )
    print(
        f"train: {len(data)} examples ({data.truncated} truncated to {args.max_length}), "
        f"{len(val)} validation, {cfg.steps} steps x {cfg.batch_size}",
        file=sys.stderr,
    )
    bar = Progress("step", "train", args.quiet)
    try:
        progress = train(
            loaded,
            params,
            data,
            val,
            out,
            cfg,
            medusa=heads,
            hooks=Hooks(
                log=bar.log, on_step=step_progress(bar), log_steps=not (args.quiet or shows_bar())
            ),
        )
    finally:
        bar.close()
    last = dict(progress["validations"][-1]) if progress["validations"] else {}
    acceptance = last.pop("acceptance", None)  # its own file in the adapter folder
    extra = {
        "training": {
            "data": data.summary,
            "validation_examples": len(val),
            "train_config": progress["train_config"],
            "seconds": round(progress["seconds"], 1),
            "validation": last,
            "loss_history": progress["history"][-10:],
            "loss_curve": loss_curve(progress["history"]),
        }
    }
    if args.from_adapter:  # the streams' own training (its data's sources and licences) travels
        extra["training"]["streams_from"] = streams_from
    if heads is not None:
        from specstream_mlx.baselines.medusa import save_medusa

        save_medusa(out, heads, loaded, extra=extra)
        print(f"wrote {out}: tau chain {last.get('tau_chain')} (validation estimate)")
    elif baseline:
        save_lora_adapter(out, loaded, extra=extra, overwrite=args.overwrite)
        print(f"wrote {out}: next-token NLL {last.get('next_token_nll')} (validation)")
    else:
        from specstream_mlx.decoding.plan import Acceptance

        if acceptance is not None:
            params.acceptance = Acceptance.from_dict(acceptance)
        if vocab:  # validation above scored the whole head's drafts
            params.config = replace(params.config, draft_vocab=vocab)
        save_adapter(out, params, loaded, extra=extra, overwrite=args.overwrite)
        print(
            f"wrote {out}: tau chain {last.get('tau_chain')}, tau tree {last.get('tau_tree')} "
            f"(validation estimate)"
        )
    Checkpoint(out).remove()
    return 0


def _draft_vocab(args, params, data, loaded) -> tuple[int, ...]:
    """--draft-vocab's tokens (the commonest targets of --data), checked against the adapter's
    settings before training starts; a note when --data holds fewer distinct targets."""
    from specstream_mlx import SpecstreamError
    from specstream_mlx.training.data import draft_vocabulary

    size, n_vocab, top_k = args.draft_vocab, loaded.config["vocab_size"], params.config.top_k
    if size > n_vocab:
        raise SpecstreamError(f"--draft-vocab {size}: the model has {n_vocab} tokens")
    vocab = draft_vocabulary(data.examples, size)
    if len(vocab) < top_k:
        raise SpecstreamError(
            f"--draft-vocab {size} keeps {len(vocab)} tokens, fewer than the {top_k} the streams "
            "draft at each node (--tree-top-k): give at least that many"
        )
    if len(vocab) < size:
        print(
            f"train: --draft-vocab {size}: --data has {len(vocab)} distinct target tokens; "
            "the vocabulary keeps them all",
            file=sys.stderr,
        )
    return vocab
