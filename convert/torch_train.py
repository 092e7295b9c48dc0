"""Training stream adapters in PyTorch (CUDA or CPU), both modes, with the loss of eq. 6 as the
MLX trainer computes it (specstream_mlx/training/forward.py):

- lossless: the base is frozen; every position with a stream target carries gamma streams in the
  MSA layers; loss = sum_j NLL(stream j) + the pruning head's next-token NLL;
- shared: PEFT LoRA on every linear layer of every block, trained with the streams; loss =
  NLL(main stream) + 0.1 * sum_j NLL(stream j) + the pruning head's NLL;
- next-token: the paper's "Baseline", the same LoRA trained on the model's next-token NLL alone
  (no streams), written as the MLX trainer's next-token folder (mlx-lm's LoRA layout).

Data: the MLX trainer's jsonl shapes and writing-tool tasks (specstream_mlx.training.data, which
is mlx-free). Writes a PyTorch adapter folder; `specstream convert` turns it into an MLX one.

    python -m convert.torch_train --data train.jsonl --mode shared --steps 200 --out my_adapter
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specstream_mlx.decoding.tree import Tree
from specstream_mlx.errors import SpecstreamError
from specstream_mlx.streams.config import StreamConfig, as_it_ran
from specstream_mlx.training.history import loss_curve
from specstream_mlx.training.positions import (
    segment,
    shared_stream_positions,
    stream_positions,
)

from .torch_adapter import add_lora, save_next_token_lora, save_torch_adapter, start_from
from .torch_base import ChatTokenizer, TorchBase, load_base
from .torch_streams import TorchStreams, View, chain, lower_layers, msa_layers


@dataclass
class Losses:
    total: torch.Tensor
    stream_nll: list[float]
    prune_nll: float
    main_nll: float | None
    stream_hits: list[tuple[int, int]]  # (correct, counted) per stream


@dataclass
class Sequence:
    ids: list[int]
    loss_mask: list[bool]
    positions: np.ndarray | None = None  # lossless: the positions carrying streams (default: all)


def sequence_loss(
    view: View,
    streams: TorchStreams,
    ids: list[int],
    loss_mask: list[bool],
    positions: np.ndarray | None = None,
    targets: str = "text",
) -> Losses:
    """The loss of one sequence (see the module docstring). Lossless mode: `positions` (default:
    every position with a stream target) carry streams."""
    return batch_loss(view, streams, [Sequence(ids, loss_mask, positions)], targets=targets)


@dataclass
class Pack:
    """A batch's sequences end to end, as one pass runs them."""

    tree: Tree  # each sequence a chain of its own: positions restart, ancestors block-diagonal
    seq: np.ndarray  # (T,) the sequence each token belongs to
    loss_mask: np.ndarray  # (T,) bool
    starts: np.ndarray  # (n,) each sequence's first token

    @classmethod
    def of(cls, batch: list[Sequence]) -> Pack:
        tokens, parents, depths = [], [], []
        for s in batch:
            start = len(tokens)
            tokens += s.ids
            parents += [-1] + list(range(start, start + len(s.ids) - 1))
            depths += list(range(len(s.ids)))
        lengths = [len(s.ids) for s in batch]
        return cls(
            Tree(tokens, parents, depths),
            np.repeat(np.arange(len(batch)), lengths),
            np.concatenate([np.asarray(s.loss_mask, bool) for s in batch]),
            np.cumsum([0] + lengths)[:-1],
        )

    def targets(self, rows: np.ndarray, offset: np.ndarray | int) -> np.ndarray:
        """bool per row: token row + offset is a target of the row's own sequence."""
        r = rows + offset
        inside = r < len(self.seq)
        r = np.where(inside, r, 0)
        return inside & (self.seq[r] == self.seq[rows]) & self.loss_mask[r]


def _stream_rows(cfg, batch: list[Sequence], starts) -> tuple[np.ndarray, np.ndarray]:
    """(carry, positions): the packed positions whose streams run, and those of them whose
    streams are scored, per sequence as sequence_loss chooses them."""
    carry, scored = [], []
    for s, start in zip(batch, starts, strict=True):
        mask = np.asarray(s.loss_mask, bool)
        if cfg.mode == "shared":
            c = shared_stream_positions(cfg, mask)
            p = np.intersect1d(stream_positions(mask, cfg.gamma), c)
        else:
            c = p = stream_positions(mask, cfg.gamma) if s.positions is None else s.positions
        carry.append(np.asarray(c, int) + start)
        scored.append(np.asarray(p, int) + start)
    return np.concatenate(carry), np.concatenate(scored)


def _per_sequence(view: View, pack: Pack, values: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """(n,): the mean of `values` (one per row) over each sequence's rows; 0 where it has none."""
    n, owner = len(pack.starts), pack.seq[rows]
    sums = torch.zeros(n, device=view.device).index_add(0, view.tensor(owner), values)
    return sums / view.tensor(np.maximum(np.bincount(owner, minlength=n), 1))


def _same_sequence(pack: Pack, t: int) -> np.ndarray:
    """bool per row r < t - 1: token r + 1 belongs to row r's sequence."""
    return pack.seq[1:t] == pack.seq[: t - 1]


def _stream_terms(view, pack: Pack, hidden, positions: np.ndarray, gamma: int, ids_t):
    """((gamma, n) per-sequence mean NLL of each stream, [(right, counted)] per stream): stream
    j of position p predicts token p + 1 + j (of `ids_t`), where that token is a target."""
    rows, js = np.nonzero(np.stack([pack.targets(positions, 1 + j) for j in range(1, gamma + 1)]).T)
    js = js + 1
    if not len(rows):
        return torch.zeros((gamma, len(pack.starts)), device=view.device), [(0, 0)] * gamma
    logits = view.head(hidden[view.tensor(rows).long(), view.tensor(js - 1).long()]).float()
    targets = ids_t[view.tensor(positions[rows] + 1 + js).long()]
    nll = F.cross_entropy(logits, targets, reduction="none")
    right = (logits.argmax(-1) == targets).cpu().numpy()
    terms = [
        _per_sequence(view, pack, nll[view.tensor(js == j)], positions[rows[js == j]])
        for j in range(1, gamma + 1)
    ]
    hits = [(int(right[js == j].sum()), int((js == j).sum())) for j in range(1, gamma + 1)]
    return torch.stack(terms), hits


def _spanned(pack: Pack, positions: np.ndarray, gamma: int) -> np.ndarray:
    """bool per token: within its sequence, from the first stream position to gamma past the
    last (the rows lossless mode trains the pruning head on)."""
    covered = np.zeros(len(pack.seq), bool)
    for s in range(len(pack.starts)):
        own = positions[pack.seq[positions] == s]
        if len(own):
            covered[own[0] : own[-1] + gamma + 1] = True
    return covered


def batch_loss(
    view: View,
    streams: TorchStreams,
    batch: list[Sequence],
    targets: str = "text",
    alpha_main: float = 1.0,
    alpha_stream: float = 0.1,
) -> Losses:
    """The sum of the sequences' losses, each as sequence_loss gives it (the logged NLLs are
    their means over the sequences), from one pass over them packed end to end: a step then
    launches one pass's kernels, not one pass's per sequence, which is what bounds a GPU step.
    `targets` (lossless only): "text", the tokens themselves, or "self", the frozen base's
    greedy prediction of each token, as the MLX trainer's --targets. `alpha_stream`: shared
    mode's weight of the streams' terms (eq. 6: 0.1; with Adam it sets how much of the shared
    LoRA's update serves the streams, the streams' own parameters being scale-free)."""
    cfg = streams.config
    shared = cfg.mode == "shared"
    if targets not in ("text", "self") or (shared and targets != "text"):
        raise SpecstreamError(f"targets {targets!r}: text, or self in lossless mode")
    pack = Pack.of(batch)
    t = len(pack.seq)
    ids_t = view.tensor(pack.tree.tokens).long()
    with torch.set_grad_enabled(shared and torch.is_grad_enabled()):  # lossless: frozen
        h_low = lower_layers(view, len(view.layers) - cfg.n_msa_layers, pack.tree, None, 0)
    carry, positions = _stream_rows(cfg, batch, pack.starts)
    depths = view.tensor(pack.tree.depths)
    anc = pack.tree.ancestors()  # (T, T): causal within each sequence, nothing across
    x = msa_layers(view, streams, h_low, depths, anc, None, 0, stream_nodes=carry)
    index = view.tensor(np.searchsorted(carry, positions)).long()
    hidden = x[0, t:].reshape(len(carry), cfg.gamma, -1)[index]  # (P, gamma, d)
    if targets == "self":  # the frozen base's main rows: row r's greedy token replaces r + 1's
        with torch.no_grad():
            greedy = view.head(x[0, : t - 1]).argmax(-1)
        follows = view.tensor(_same_sequence(pack, t))
        ids_t = torch.cat([ids_t[:1], torch.where(follows, greedy, ids_t[1:])])
    terms, hits = _stream_terms(view, pack, hidden, positions, cfg.gamma, ids_t)
    total = (alpha_stream if shared else 1.0) * terms.sum()
    # the pruning head: next-token NLL on the hidden state at the pruning point (its own
    # parameters only), over the rows the streams span (lossless) or every target (shared)
    nexts = pack.targets(np.arange(t), 1)  # row r predicts token r + 1
    rows = np.nonzero(nexts if shared else nexts & _spanned(pack, positions, cfg.gamma))[0]
    prune = torch.zeros(len(batch), device=view.device)
    if len(rows):
        r = view.tensor(rows).long()
        h = h_low[0, r].detach()
        nll = F.cross_entropy(
            view.head(h + streams.prune(h)).float(), ids_t[r + 1], reduction="none"
        )
        prune = _per_sequence(view, pack, nll, rows)
    total = total + prune.sum()
    main_nll = None
    if shared:
        main = _main_term(view, pack, x[0, :t], ids_t)
        total = total + alpha_main * main.sum()
        main_nll = float(main.detach().mean())
    stream_nll = terms.detach().mean(1).tolist()
    return Losses(total, stream_nll, float(prune.detach().mean()), main_nll, hits)


def _main_term(view: View, pack: Pack, hidden: torch.Tensor, ids_t) -> torch.Tensor:
    """(n,): each sequence's mean next-token NLL of its targets from the main rows' last hidden
    states (T, d)."""
    rows = np.nonzero(pack.targets(np.arange(len(pack.seq)), 1))[0]  # row r predicts r + 1
    r = view.tensor(rows).long()
    nll = F.cross_entropy(view.head(hidden[r]).float(), ids_t[r + 1], reduction="none")
    return _per_sequence(view, pack, nll, rows)


def next_token_loss(view: View, batch: list[Sequence]) -> Losses:
    """The next-token LoRA baseline's loss (`--mode next-token`, the MLX trainer's `next-token`
    mode): the sum of the sequences' mean next-token NLLs under the model and its LoRA, from one
    packed pass; no streams."""
    pack = Pack.of(batch)
    hidden = lower_layers(view, len(view.layers), pack.tree, None, 0)[0]
    main = _main_term(view, pack, hidden, view.tensor(pack.tree.tokens).long())
    return Losses(main.sum(), [], 0.0, float(main.detach().mean()), [])


@dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 4  # sequences per optimizer step (packed into one pass: batch_loss)
    learning_rate: float = 5e-4  # stream parameters
    lora_learning_rate: float = 5e-5  # shared mode's LoRA (at scale 20, as the MLX trainer)
    warmup: int = 10
    segment: int = 64  # lossless: stream positions per sequence per step; 0 = all
    targets: str = "text"  # lossless: "self" learns the frozen base's greedy tokens (batch_loss)
    seed: int = 0
    stream_weight: float = 0.1  # shared mode's alpha_j (eq. 6)
    log_every: int = 10
    checkpoint_every: int = 25
    init: str | None = None  # the adapter folder this run continues (main loads it: --init)


def _lora_params(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


def hidden_scale(view: View, n_low: int, examples: list) -> float:
    """Median per-token RMS of the hidden states at the pruning point (the MLX trainer's
    `hidden_scale`): about 17 for SmolLM2."""
    with torch.no_grad():
        rms = [
            lower_layers(view, n_low, chain(ex.ids), None, 0)[0].float().pow(2).mean(-1).sqrt()
            for ex in examples
        ]
    return float(np.median(torch.cat(rms).cpu().numpy()))


def lr_factor(t: int, warmup: int, steps: int) -> float:
    """The MLX trainer's schedule at update t (from 0): linear warmup from 1/10 of the rate over
    max(warmup, 1) updates, then linear decay to 0 over steps - warmup updates."""
    w = max(warmup, 1)
    if t < w:
        return 0.1 + 0.9 * t / w
    decay = max(steps - warmup, 1)
    return 1.0 - min(t - w, decay) / decay


def set_rates(optimizer: torch.optim.Optimizer, base_lrs: list[float], step: int, cfg) -> None:
    """The rates of update `step` (from 1): the MLX trainer's schedule, times the factor that
    makes torch's AdamW take MLX's step (`mlx_adam_factor`)."""
    factor = lr_factor(step - 1, cfg.warmup, cfg.steps) * mlx_adam_factor(step)
    for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
        group["lr"] = lr * factor


def mlx_adam_factor(step: int, betas: tuple[float, float] = (0.9, 0.999)) -> float:
    """torch's AdamW divides its moments by (1 - b1^t) and (1 - b2^t), MLX's (bias_correction
    False, its default, which the shipped adapters were trained with) does not, so early MLX
    steps are larger: 3.2x at step 1, 6.5x at 10-15, 1.4x at 750. Scaling torch's rate by
    (1 - b1^t) / sqrt(1 - b2^t) gives MLX's update (up to where epsilon sits). Without it the
    same recipe trained weaker streams (data2text stream-1 top-1 0.27 against the MLX
    trainer's 0.60; with it 0.57: docs/BENCHMARKS.md, "Training on the GPU")."""
    b1, b2 = betas
    return (1 - b1**step) / (1 - b2**step) ** 0.5


def _adapter_output(name: str) -> bool:
    """A stream adapter's output matrix (`adapters.<i>.up.weight`, the MLX `b`): it adds to the
    residual stream, so, as on the MLX side, its rate is scaled by the hidden states' RMS."""
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "adapters" and parts[2] == "up"


def _run_identity(streams, cfg: TrainConfig, examples) -> tuple:
    """What a checkpoint must share with the run that resumes it."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("log_every", "checkpoint_every")}
    what = streams.config.to_dict() if streams is not None else "next-token"
    return what, settings, [len(e.ids) for e in examples]


def _with_new_fields(saved: tuple, identity: tuple) -> tuple:
    """A checkpoint's identity with the StreamConfig fields added since it was saved at their
    defaults, as its run ran them (`as_it_ran`)."""
    return (as_it_ran(saved[0], identity[0]), *saved[1:])


def _save_checkpoint(path: Path, state: dict) -> None:
    """Atomically: written beside, then renamed over the previous one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


@dataclass
class _Draw:
    """Where the run is in its examples: the seeded order, the next index in it, the log rows
    so far and the next step (what a checkpoint keeps besides the weights and the optimizer)."""

    rng: np.random.RandomState
    order: np.ndarray
    cursor: int = 0
    rows: list = field(default_factory=list)
    first: int = 1

    def next_example(self, examples: list):
        if self.cursor == len(self.order):
            self.order, self.cursor = self.rng.permutation(len(examples)), 0
        self.cursor += 1
        return examples[self.order[self.cursor - 1]]


def train(
    base: TorchBase,
    streams: TorchStreams | None,
    examples: list,
    cfg: TrainConfig,
    log=None,
    checkpoint: str | os.PathLike | None = None,
) -> list[dict]:
    """AdamW with warmup and linear decay over `examples` (objects with ids and loss_mask). In
    shared mode the base must already carry its LoRA layers (add_lora); with `streams` None the
    run is the next-token baseline (next_token_loss: the LoRA alone trains, as the MLX trainer's
    `train(loaded, None, ...)`). Returns the log rows.

    With `checkpoint` (a file), the whole training state is saved there every
    `checkpoint_every` steps, and a run that finds one resumes from it: an interrupted run
    continues exactly where it stopped (same data order, same optimizer state). A non-finite
    loss stops before the optimizer step, leaving the last good checkpoint."""
    if not examples:
        raise SpecstreamError("no training examples")
    shared = streams is None or streams.config.mode == "shared"  # the LoRA trains
    view = View(base.model)
    optimizer = _optimizer(base, streams, view, examples, cfg)
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    rng = np.random.RandomState(cfg.seed)
    torch.manual_seed(cfg.seed)
    base.model.train(False)  # no dropout anywhere: LoRA dropout is 0
    modules = [base.model] if streams is None else [base.model, streams]
    draw = _Draw(rng, rng.permutation(len(examples)))
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if checkpoint is not None and checkpoint.is_file():
        _resume(checkpoint, _run_identity(streams, cfg, examples), modules, optimizer, draw)
        if log is not None:
            log({"resumed_from_step": draw.first - 1})
    if streams is not None:
        streams.train()
    start = time.perf_counter()
    for step in range(draw.first, cfg.steps + 1):
        set_rates(optimizer, base_lrs, step, cfg)
        optimizer.zero_grad(set_to_none=True)
        batch = []
        for _ in range(cfg.batch_size):  # one draw after another: an example, then its positions
            batch.append(_sequence(draw.next_example(examples), streams, cfg, draw.rng))
        if streams is None:
            out = next_token_loss(view, batch)
        else:
            out = batch_loss(view, streams, batch, cfg.targets, alpha_stream=cfg.stream_weight)
        (out.total / cfg.batch_size).backward()
        row = {
            "step": step,
            "loss": round(float(out.total.detach()) / cfg.batch_size, 5),
            "stream_nll": np.round(out.stream_nll, 4).tolist(),
            "seconds": round(time.perf_counter() - start, 2),
        }
        if shared:
            row["main_nll"] = round(out.main_nll, 5)
        if not np.isfinite(row["loss"]):
            raise SpecstreamError(
                f"the loss became {row['loss']} at step {step}: lower the learning rate "
                "(the last checkpoint is kept)"
            )
        optimizer.step()
        draw.rows.append(row)
        if checkpoint is not None and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            state = _state(_run_identity(streams, cfg, examples), step, modules, optimizer, draw)
            _save_checkpoint(checkpoint, state)
        if log is not None and (step % cfg.log_every == 0 or step == cfg.steps):
            log(row)
    if streams is not None:
        streams.eval()
    return draw.rows


def _optimizer(base: TorchBase, streams, view: View, examples: list, cfg: TrainConfig):
    """AdamW over what the run trains: the streams (their groups), and the base's LoRA in
    shared mode and in a next-token run (`streams` None)."""
    groups = [] if streams is None else _stream_groups(view, streams, examples, cfg)
    if streams is None or streams.config.mode == "shared":
        lora = list(_lora_params(base.model).values())
        if not lora:
            raise SpecstreamError("the run trains the base's LoRA layers: call add_lora first")
        for p in lora:
            p.requires_grad_(True)
        groups.append({"params": lora, "lr": cfg.lora_learning_rate})
    return torch.optim.AdamW(groups, weight_decay=0.0)


def _sequence(ex, streams, cfg: TrainConfig, rng: np.random.RandomState) -> Sequence:
    """One example as the loss takes it; lossless mode draws the positions whose streams train
    (a segment of them: `cfg.segment`)."""
    positions = None
    if streams is not None and streams.config.mode == "lossless":
        every = stream_positions(np.asarray(ex.loss_mask, bool), streams.config.gamma)
        positions = segment(every, cfg.segment, rng)
    return Sequence(ex.ids, ex.loss_mask, positions)


def _state(identity: tuple, step: int, modules: list, optimizer, draw: _Draw) -> dict:
    """A checkpoint: the streams' weights (`modules[1]`, when there are streams), the base's
    LoRA, the optimizer, both random states and where the run is in its examples."""
    base = modules[0]
    return {
        "config": identity,
        "step": step,
        "streams": modules[1].state_dict() if len(modules) > 1 else {},
        "lora": {n: p.detach().clone() for n, p in _lora_params(base).items()},
        "optimizer": optimizer.state_dict(),
        "numpy_rng": draw.rng.get_state(),
        "torch_rng": torch.get_rng_state(),
        "order": draw.order,
        "cursor": draw.cursor,
        "rows": draw.rows,
    }


def _resume(path: Path, identity: tuple, modules: list, optimizer, draw: _Draw) -> None:
    """Load the checkpoint `_state` wrote into the run (refused when it is another run's)."""
    # onto the CPU first (load_state_dict moves it): a run cut on a GPU resumes anywhere
    state = torch.load(path, map_location="cpu", weights_only=False)
    if _with_new_fields(state["config"], identity) != identity:
        raise SpecstreamError(
            f"checkpoint {path} is of another run (config or data differ): remove it to start over"
        )
    if len(modules) > 1:
        modules[1].load_state_dict(state["streams"])
    with torch.no_grad():
        for name, p in _lora_params(modules[0]).items():
            p.copy_(state["lora"][name])
    optimizer.load_state_dict(state["optimizer"])
    draw.rng.set_state(state["numpy_rng"])
    torch.set_rng_state(state["torch_rng"])
    draw.order, draw.cursor, draw.rows = state["order"], state["cursor"], state["rows"]
    draw.first = state["step"] + 1


def _stream_groups(view: View, streams: TorchStreams, examples: list, cfg: TrainConfig):
    """The streams' optimizer groups: the parameters that write into the residual stream at a
    rate scaled by the hidden state's size, the rest at the streams' rate."""
    n_low = len(view.layers) - streams.config.n_msa_layers
    scale = hidden_scale(view, n_low, examples[:8])
    named = list(streams.named_parameters())
    residual = [p for n, p in named if n == "stream_embeddings" or _adapter_output(n)]
    rest = [p for n, p in named if not (n == "stream_embeddings" or _adapter_output(n))]
    return [
        {"params": residual, "lr": cfg.learning_rate * scale},
        {"params": rest, "lr": cfg.learning_rate},
    ]


def main(argv: list[str] | None = None) -> int:
    from specstream_mlx.training.data import load_dataset

    p = argparse.ArgumentParser(prog="python -m convert.torch_train", description=__doc__)
    p.add_argument("--data", required=True, help="jsonl file, or a data file with --task")
    p.add_argument("--task", choices=["summarize", "data2text", "sql"], default=None)
    p.add_argument("--out", required=True, help="adapter folder to write (next-token: an MLX one)")
    p.add_argument("--model", default=None, help="HF folder, hub id or .gguf (default: SmolLM2)")
    p.add_argument(
        "--mode",
        choices=["lossless", "shared", "next-token"],
        default="lossless",
        help="next-token: the LoRA baseline alone, no streams, written as an MLX LoRA folder",
    )
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--n-msa-layers", type=int, default=4)
    p.add_argument("--rank", type=int, default=8, help="stream adapter rank (MLX train's --rank)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--lora-lr", type=float, default=5e-5)
    p.add_argument(
        "--lora-layers",
        type=int,
        default=0,
        help="shared and next-token modes: LoRA in the top N blocks only, as MLX's train "
        "--lora-layers (0: all)",
    )
    p.add_argument("--warmup", type=int, default=10, help="updates of linear warmup")
    p.add_argument(
        "--stream-weight",
        type=float,
        default=0.1,
        help="shared mode: the streams' loss weight against the main stream's 1 (eq. 6: 0.1)",
    )
    p.add_argument(
        "--segment",
        type=int,
        default=64,
        help="lossless: stream positions per sequence per step (0: all)",
    )
    p.add_argument(
        "--targets",
        choices=["text", "self"],
        default="text",
        help="lossless: what the streams learn, the text's tokens or the base's greedy ones",
    )
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--limit", type=int, default=None, help="use the first N examples")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument(
        "--main-ignores-streams",
        action="store_true",
        help="shared mode: the main stream does not attend to the streams (MLX train's option)",
    )
    p.add_argument(
        "--init",
        default=None,
        help="continue training this adapter folder (PyTorch or MLX, same settings)",
    )
    args = p.parse_args(argv)
    next_token = args.mode == "next-token"
    try:
        if Path(args.out).exists() and not args.overwrite:
            raise SpecstreamError(f"output folder exists: {args.out} (pass --overwrite)")
        if args.steps < 1 or args.batch_size < 1 or args.checkpoint_every < 1:
            raise SpecstreamError("--steps, --batch-size and --checkpoint-every must be >= 1")
        if args.warmup < 0 or args.segment < 0:
            raise SpecstreamError("--warmup and --segment must be >= 0")
        if not 0 < args.stream_weight <= 1:  # also refuses nan
            raise SpecstreamError(f"--stream-weight must be in (0, 1], got {args.stream_weight}")
        if args.targets != "text" and args.mode != "lossless":
            raise SpecstreamError("--targets self is for lossless mode (shared mode's base moves)")
        if args.main_ignores_streams and args.mode != "shared":
            raise SpecstreamError(f"--main-ignores-streams is for shared mode, not {args.mode}")
        if next_token and args.init is not None:
            raise SpecstreamError("--init continues a stream adapter: lossless or shared mode")
        base = load_base(args.model, device=args.device)
        tokenizer = ChatTokenizer(base.tokenizer)
        data = load_dataset(args.data, tokenizer, args.max_length, task=args.task)
        examples = data.examples[: args.limit]
        config = StreamConfig(
            gamma=args.gamma,
            n_msa_layers=args.n_msa_layers,
            stream_adapter_rank=args.rank,
            mode="shared" if next_token else args.mode,  # next-token: its LoRA settings alone
            lora_blocks=_top_blocks(args, base.config["num_hidden_layers"]),
            main_reads_streams=not args.main_ignores_streams,
        )
        if not next_token:  # whose LoRA settings _top_blocks and add_lora check
            config.validate(base.config["num_hidden_layers"])
        torch.manual_seed(args.seed)
        streams = None if next_token else TorchStreams(config, base.config["hidden_size"])
        if streams is not None:
            streams.to(base.device)
        if config.mode == "shared":
            add_lora(base, config)
        continued = start_from(args.init, base, streams) if args.init is not None else None
        cfg = TrainConfig(
            args.steps,
            args.batch_size,
            args.lr,
            args.lora_lr,
            warmup=args.warmup,
            segment=args.segment,
            targets=args.targets,
            seed=args.seed,
            checkpoint_every=args.checkpoint_every,
            init=args.init,
            stream_weight=args.stream_weight,
        )
        checkpoint = Path(str(args.out).rstrip("/") + ".checkpoint.pt")
        rows = train(
            base,
            streams,
            examples,
            cfg,
            log=lambda r: print(json.dumps(r), flush=True),
            checkpoint=checkpoint,
        )
        # the data's summary carries its sources (attribution travels with the adapter)
        extra = {"training": {"data": data.summary, "examples": len(examples), **vars(cfg)}}
        extra["training"]["last"] = rows[-1]
        extra["training"]["loss_curve"] = loss_curve(rows)  # every step, resumed runs' too
        if continued is not None:  # the continued adapter's record: rounds keep their history
            extra["training"]["continues"] = continued
        if next_token:
            out = save_next_token_lora(args.out, base, config, extra, overwrite=args.overwrite)
        else:
            out = save_torch_adapter(args.out, streams, base, extra, overwrite=args.overwrite)
        checkpoint.unlink(missing_ok=True)  # the adapter is written: nothing left to resume
    except SpecstreamError as exc:
        print(f"convert.torch_train: error: {exc}", file=sys.stderr)
        return 2
    if next_token:  # already the MLX trainer's layout
        print(f"wrote {out} (an MLX LoRA folder: specstream bench --lora {out})")
    else:
        print(f"wrote {out} (for the Mac: specstream convert --from {out} --to {out}-mlx)")
    return 0


def _top_blocks(args, n_layers: int) -> tuple[int, ...] | None:
    """The blocks --lora-layers puts LoRA in (None: every block)."""
    if not args.lora_layers:
        return None
    if args.mode == "lossless":
        raise SpecstreamError("--lora-layers is for the LoRA of shared and next-token modes")
    low = 1 if args.mode == "next-token" else args.n_msa_layers
    if not low <= args.lora_layers <= n_layers:
        raise SpecstreamError(
            f"--lora-layers must be in [{low}, {n_layers}] (shared mode: at least the MSA "
            f"layers), got {args.lora_layers}"
        )
    return tuple(range(n_layers - args.lora_layers, n_layers))


if __name__ == "__main__":
    sys.exit(main())
