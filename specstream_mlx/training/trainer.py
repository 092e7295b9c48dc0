"""The training loop for stream adapters: AdamW with warmup and linear decay, gradient
accumulation over sequences, periodic validation (per-stream top-1 accuracy, estimated tau),
atomic resumable checkpoints, and a stop that keeps the last good checkpoint on a NaN loss."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.tuner.lora import LoRALinear

from ..decoding.plan import Acceptance
from ..decoding.tree_step import stream_logits
from ..errors import SpecstreamError
from ..folders import staged_folder
from ..models.arch import arch_of
from ..streams.config import as_it_ran
from ..streams.lora import lora_settings
from ..streams.params import StreamParams
from .data import Dataset, Example
from .forward import (
    BaseFeatures,
    Frozen,
    StreamStates,
    base_features,
    lower_hidden,
    next_token_loss,
    parent_loss,
    shared_hidden,
    shared_loss,
    stream_hidden,
    stream_loss,
)
from .medusa_loss import final_hidden, medusa_loss
from .positions import segment, shared_stream_positions, stream_positions


@dataclass
class TrainConfig:
    steps: int = 200  # optimizer steps
    batch_size: int = 4  # sequences per step (gradients accumulated, one sequence at a time)
    learning_rate: float = 5e-4
    warmup: int = 10
    val_every: int = 50
    checkpoint_every: int = 25
    seed: int = 0
    segment: int = 64  # stream positions per sequence per step (a random run); 0 = all
    lora_learning_rate: float = 5e-5  # shared mode's LoRA layers (at mlx-lm's scale 20)
    targets: str = "text"  # lossless streams learn the text's tokens, or "self": the frozen
    # base's greedy predictions on it, or "soft": those and its distribution (training.forward)
    lora_layers: int = 0  # shared, next-token: only the LoRA of the top lora_layers blocks
    # trains (0: every block's); the blocks below run once per sequence, their output cached
    parents_only: bool = False  # lossless with parent heads: only they train, on the given
    # (already trained) streams, whose states are computed once per sequence and cached


@dataclass
class StepReport:
    """What `train` tells its `on_step` callback after each optimizer step."""

    step: int  # steps done, this call's and a resumed checkpoint's
    steps: int  # cfg.steps
    loss: float
    tokens: int  # tokens of the step's sequences
    seconds: float  # the step's own time


@dataclass
class Validation:
    stream_accuracy: list[float]  # top-1 accuracy of stream j = 1..gamma
    tau_chain: float  # estimated accepted tokens per pass with a k=1 chain
    tau_tree: float  # ... with every stream's top-k in the tree
    positions: int
    # decoding.plan.Acceptance.to_dict(): rank paths of the targets, for the device's tree choice
    acceptance: dict | None = None
    # mean negative log-likelihood of stream j's target (nats), as training logs `stream_nll`
    stream_nll: list[float] | None = None


def _example_order(n: int, index: int, seed: int) -> int:
    epoch, offset = divmod(index, n)
    return int(np.random.RandomState(seed + epoch).permutation(n)[offset])


def _leading_true(hits: np.ndarray) -> np.ndarray:
    """(P, gamma) bool -> (P,) length of the leading run of True per row."""
    return np.cumprod(hits, axis=1).sum(axis=1)


def validate(examples: list[Example], logits_of, gamma: int, top_k: int) -> Validation:
    """Greedy and top-k hits of the gamma drafters (streams, or Medusa heads) on held-out
    sequences, where all gamma targets exist. `logits_of(i, rows)` gives the (P, gamma, V)
    logits of example i's rows; drafter j at position p predicts token p + 1 + j."""
    top1, topk, ranks, nll = [], [], [], []
    for i, ex in enumerate(examples):
        mask, t = np.array(ex.loss_mask), len(ex.loss_mask)
        # position p is scored when tokens p+1 .. p+1+gamma are all completion tokens
        rows = [p for p in range(t - 1 - gamma) if mask[p + 1 : p + 2 + gamma].all()]
        if not rows:
            continue
        logits = logits_of(i, np.array(rows))  # (P, gamma, V)
        ids = np.array(ex.targets)
        targets = np.array([[ids[p + 1 + j] for j in range(1, gamma + 1)] for p in rows])
        best = np.array(mx.argpartition(-logits, top_k - 1, axis=-1)[..., :top_k])
        top1.append(np.array(mx.argmax(logits, axis=-1)) == targets)
        topk.append((best == targets[..., None]).any(-1))
        # rank of each target: how many tokens score strictly higher
        target_logits = mx.take_along_axis(logits, mx.array(targets)[..., None], axis=-1)
        ranks.append(np.array((logits > target_logits).sum(axis=-1)))
        logz = mx.logsumexp(logits.astype(mx.float32), axis=-1)
        nll.append(np.array(logz - target_logits[..., 0].astype(mx.float32)))
    if not top1:
        raise SpecstreamError("no validation position has gamma completion tokens after it")
    top1, topk = np.concatenate(top1), np.concatenate(topk)
    acceptance = Acceptance.from_ranks(np.concatenate(ranks).tolist(), gamma, "training validation")
    return Validation(
        stream_accuracy=[round(float(a), 4) for a in top1.mean(axis=0)],
        tau_chain=round(1 + float(_leading_true(top1).mean()), 4),
        tau_tree=round(1 + float(_leading_true(topk).mean()), 4),
        positions=int(top1.shape[0]),
        acceptance=acceptance.to_dict(),
        stream_nll=[round(float(x), 4) for x in np.concatenate(nll).mean(axis=0)],
    )


def validate_streams(arch, params: StreamParams, examples: list[Example], hidden_of) -> Validation:
    """`validate` for streams: `hidden_of(i, rows)` gives their (P, gamma, d) hidden states."""

    def logits_of(i, rows):  # parent heads: stream 1 reads the token before its target
        parents = mx.array(examples[i].targets)[mx.array(rows) + 1]
        return stream_logits(arch, params, hidden_of(i, rows), parents)

    return validate(examples, logits_of, params.config.gamma, params.config.top_k)


class FeatureCache:
    """The frozen base's features of each training sequence, computed on first use and kept
    while they fit in `max_bytes` (a later epoch then runs only the streams)."""

    def __init__(self, features, examples: list[Example], max_bytes: int):
        self.features, self.examples = features, examples  # features(example) -> BaseFeatures
        self.max_bytes, self.nbytes = max_bytes, 0
        self.kept: dict[int, BaseFeatures] = {}

    def __getitem__(self, i: int) -> BaseFeatures:
        if i in self.kept:
            return self.kept[i]
        feats = self.features(self.examples[i])
        if self.nbytes + feats.nbytes <= self.max_bytes:
            self.kept[i] = feats
            self.nbytes += feats.nbytes
        return feats


class Checkpoint:
    """`{out}.checkpoint/`: stream parameters, optimizer state and progress, replaced atomically."""

    def __init__(self, out_dir: Path):
        out_dir = Path(os.path.abspath(out_dir))  # "." names the current folder
        self.path = out_dir.with_name(out_dir.name + ".checkpoint")

    def exists(self) -> bool:
        return (self.path / "progress.json").is_file()

    def save(self, module, optimizer, progress: dict) -> None:
        with staged_folder(self.path, overwrite=True) as tmp:
            weights = dict(tree_flatten(module.trainable_parameters()))
            mx.save_safetensors(str(tmp / "params.safetensors"), weights)
            state = dict(tree_flatten(optimizer.state))
            mx.save_safetensors(str(tmp / "optimizer.safetensors"), state)
            (tmp / "progress.json").write_text(json.dumps(progress, indent=2))

    def progress(self) -> dict:
        try:
            progress = json.loads((self.path / "progress.json").read_text())
        except ValueError as exc:
            raise self.unreadable(exc) from None
        if not isinstance(progress, dict) or not isinstance(progress.get("step"), int):
            raise self.unreadable("progress.json holds no step count")
        return progress

    def load(self, module, optimizer) -> dict:
        try:
            params = mx.load(str(self.path / "params.safetensors"))
            state = mx.load(str(self.path / "optimizer.safetensors"))
            module.update(tree_unflatten(list(params.items())))
        except Exception as exc:  # mlx: RuntimeError/ValueError on a missing or broken file
            raise self.unreadable(exc) from None
        optimizer.state = tree_unflatten(list(state.items()))
        return self.progress()

    def unreadable(self, why) -> SpecstreamError:
        return SpecstreamError(
            f"unreadable checkpoint {self.path} ({why}): remove it to train from the start"
        )

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def hidden_scale(hidden: list[mx.array]) -> float:
    """Median per-token RMS of (T, d) hidden states at the pruning point."""
    rms = [np.array(mx.sqrt((h.astype(mx.float32) ** 2).mean(axis=-1))) for h in hidden]
    return float(np.median(np.concatenate(rms)))


def adamw(cfg: TrainConfig, lr: float) -> optim.AdamW:
    """AdamW at peak rate `lr`: linear warmup from lr / 10, then linear decay to 0."""
    warmup = optim.linear_schedule(lr / 10, lr, max(cfg.warmup, 1))
    decay = optim.linear_schedule(lr, 0.0, max(cfg.steps - cfg.warmup, 1))
    schedule = optim.join_schedules([warmup, decay], [max(cfg.warmup, 1)])
    return optim.AdamW(learning_rate=schedule, weight_decay=0.0)


def make_optimizer(cfg: TrainConfig, embedding_scale: float) -> optim.Optimizer:
    """AdamW with warmup and linear decay. Adam moves every weight by about the learning rate per
    step whatever the weight's scale; stream embeddings and the stream adapters' output matrices
    add to hidden states of RMS `embedding_scale` (about 17 for SmolLM2), so their learning rate
    is scaled to match (with the plain rate, 8 memorised sequences reached stream-1 top-1 0.07
    after 160 steps; scaled, 0.21: docs/BENCHMARKS.md). Shared mode's LoRA layers (output scaled
    by 20) have their own, smaller learning rate."""

    lr = cfg.learning_rate
    residual = adamw(cfg, lr * embedding_scale)
    lora = adamw(cfg, cfg.lora_learning_rate)
    rest = adamw(cfg, lr)
    return optim.MultiOptimizer(
        [residual, lora, rest],
        [
            lambda path, _: path.endswith("stream_embeddings") or _adapter_output(path),
            lambda path, _: path.endswith((".lora_a", ".lora_b")),
        ],
    )


def _adapter_output(path: str) -> bool:
    """A stream adapter's output matrix ("adapters.<i>.b"), which adds to the residual stream."""
    parts = path.split(".")
    return len(parts) >= 3 and parts[-3] == "adapters" and parts[-1] == "b"


class SharedTrainable(nn.Module):
    """Shared mode's trainable parts: the model's LoRA layers (the base is frozen) and the
    stream parameters."""

    def __init__(self, model: nn.Module, streams: StreamParams):
        super().__init__()
        self.model, self.streams = model, streams


class LosslessObjective:
    """Frozen base: only the streams run in a step, on the base's cached features and a random
    segment of positions per sequence."""

    terms = "streams"

    def __init__(self, arch, params, data: Dataset, val: list[Example], cfg, cache_bytes: int):
        self.arch, self.params, self.data, self.cfg = arch, params, data, cfg
        self.module = params
        n_msa = params.config.n_msa_layers

        def features(ex: Example) -> BaseFeatures:
            return base_features(arch, n_msa, ex.ids, ex.loss_mask, cfg.targets)

        self.features = FeatureCache(features, data.examples, cache_bytes)
        self.val = [features(ex) for ex in val]
        self.scale = hidden_scale([f.h_low for f in self.val])

    def loss(self, module, i: int, seen: int):
        feats = self.features[i]
        rng = np.random.RandomState([self.cfg.seed, seen])
        every = stream_positions(feats.loss_mask, module.config.gamma)
        out = stream_loss(self.arch, module, feats, segment(every, self.cfg.segment, rng))
        return out.total, mx.stack(out.stream_nll)

    def val_hidden(self, i: int, rows: np.ndarray) -> mx.array:
        return stream_hidden(self.arch, self.params, self.val[i], rows)

    def validate(self) -> dict:
        return asdict(validate_streams(self.arch, self.params, self.val, self.val_hidden))


class ParentObjective:
    """Parent heads on trained streams (TrainConfig.parents_only): everything else is frozen,
    so the streams' last hidden states are a constant of each sequence, `states_of(example)`
    (StreamStates: lossless or shared mode's), computed once and cached; a step runs only the
    parent heads and the LM head on a segment of positions."""

    terms = "streams"
    scale = 1.0  # the learning rate's residual scaling is for stream weights, frozen here

    def __init__(self, arch, params, states_of, data: Dataset, val: list[Example], cfg, cache):
        params.freeze()
        for head in params.parent_heads:
            head.unfreeze()
        self.arch, self.params, self.data, self.cfg, self.module = arch, params, data, cfg, params
        self.features = FeatureCache(states_of, data.examples, cache)
        self.val = [states_of(ex) for ex in val]

    def loss(self, module, i: int, seen: int):
        states = self.features[i]
        rng = np.random.RandomState([self.cfg.seed, seen])
        rows = segment(states.positions, self.cfg.segment, rng)
        total, nll = parent_loss(self.arch, module, states, rows)
        return total, mx.stack(nll)

    def val_hidden(self, i: int, rows: np.ndarray) -> mx.array:
        states = self.val[i]
        return states.hidden[mx.array(np.searchsorted(states.positions, rows))]

    def validate(self) -> dict:
        return asdict(validate_streams(self.arch, self.params, self.val, self.val_hidden))


def parent_objective(arch, params, data: Dataset, val: list[Example], cfg, cache_bytes: int):
    """ParentObjective over the streams of `params`, lossless (on the frozen base's features)
    or shared (through the model's LoRA layers)."""
    if params.config.mode == "shared":
        return ParentObjective(
            arch, params, lambda ex: StreamStates.shared(arch, params, ex.ids, ex.loss_mask),
            data, val, cfg, cache_bytes,
        )  # fmt: skip
    n_msa = params.config.n_msa_layers

    def states_of(ex: Example) -> StreamStates:
        feats = base_features(arch, n_msa, ex.ids, ex.loss_mask, cfg.targets)
        return StreamStates.of(arch, params, feats)

    return ParentObjective(arch, params, states_of, data, val, cfg, cache_bytes)


class SharedObjective:
    """Shared mode (eq. 3 and 6): the model runs with its LoRA layers; every position carries
    streams and the main stream attends to them; alpha_0 = 1, alpha_j = 0.1. Blocks whose LoRA
    does not train (cfg.lora_layers) run once per sequence, their output cached."""

    terms = "main, streams"

    def __init__(self, arch, params, model, data: Dataset, val: list[Example], frozen: Bottom):
        self.arch, self.params, self.data, self.val = arch, params, data, val
        self.module = SharedTrainable(model, params)
        self.frozen, self.val_frozen = frozen.cache(data.examples), frozen.of(val)
        n_low = len(arch.layers) - params.config.n_msa_layers
        self.scale = hidden_scale([lower_hidden(arch, n_low, mx.array(ex.ids))[0] for ex in val])

    def loss(self, module, i: int, seen: int):
        ex = self.data.examples[i]
        out = shared_loss(self.arch, module.streams, ex.ids, ex.loss_mask, self.frozen[i])
        return out.total, mx.stack([out.main_nll, *out.stream_nll])

    def val_hidden(self, i: int, rows: np.ndarray) -> mx.array:
        ex = self.val[i]
        carry = shared_stream_positions(self.params.config, np.array(ex.loss_mask))
        streams = shared_hidden(self.arch, self.params, self.val_frozen[i], carry)[2]
        return streams[mx.array(np.searchsorted(carry, rows))]  # scored rows all carry streams

    def validate(self) -> dict:
        return asdict(validate_streams(self.arch, self.params, self.val, self.val_hidden))


class NextTokenObjective:
    """The paper's "Baseline": LoRA layers (the same as shared mode's) trained on next-token
    loss alone, no streams; the model then decodes one token per pass."""

    terms, scale = "main", 1.0

    def __init__(self, model, data: Dataset, val: list[Example], frozen: Bottom):
        self.module, self.data, self.val = model, data, val
        self.bottom, self.frozen, self.val_frozen = frozen, frozen.cache(data.examples), None

    def _loss(self, module, ex: Example, frozen: Frozen):
        top = None if not self.bottom.blocks else (self.bottom.arch, frozen)
        return next_token_loss(module, ex.ids, ex.loss_mask, top)

    def loss(self, module, i: int, seen: int):
        nll, _ = self._loss(module, self.data.examples[i], self.frozen[i])
        return nll, nll[None]

    def validate(self) -> dict:
        if self.val_frozen is None:
            self.val_frozen = self.bottom.of(self.val)
        nlls, hits = [], []
        for ex, frozen in zip(self.val, self.val_frozen, strict=True):
            nll, hit = self._loss(self.module, ex, frozen)
            nlls.append(nll.item() * hit.size)
            hits.append(np.array(hit))
        hits = np.concatenate(hits)
        if not hits.size:
            raise SpecstreamError("no validation example has a completion token")
        return {
            "next_token_nll": round(sum(nlls) / hits.size, 4),
            "next_token_accuracy": round(float(hits.mean()), 4),
            "positions": int(hits.size),
        }


@dataclass
class Bottom:
    """The blocks below the LoRA that trains (cfg.lora_layers): their output per sequence,
    computed once (`blocks` = 0: every block trains, nothing is cached but the embeddings)."""

    arch: object
    blocks: int
    cache_bytes: int

    def cache(self, examples: list[Example]) -> FeatureCache:
        limit = self.cache_bytes if self.blocks else 0
        return FeatureCache(lambda ex: Frozen.of(self.arch, ex.ids, self.blocks), examples, limit)

    def of(self, examples: list[Example]) -> list[Frozen]:
        return [Frozen.of(self.arch, ex.ids, self.blocks) for ex in examples]


@contextmanager
def training_top_lora(model, n_frozen: int):
    """Freeze the LoRA layers of the first `n_frozen` blocks for the block (they must be zero,
    as `apply_lora` makes them: the cached features assume the base weights there)."""
    frozen = [m for layer in model.model.layers[:n_frozen] for m in _lora_layers(layer)]
    if any(mx.any(m.lora_b != 0).item() for m in frozen):
        raise SpecstreamError(
            "lora_layers trains the top blocks' LoRA from the base: the LoRA below them must "
            "be zero (apply_lora makes it so)"
        )
    for m in frozen:
        m.freeze(keys=["lora_a", "lora_b"], recurse=False)
    try:
        yield
    finally:
        for m in frozen:
            m.unfreeze(keys=["lora_a", "lora_b"], recurse=False)


def _lora_layers(layer) -> list:
    return [m for _, m in layer.named_modules() if isinstance(m, LoRALinear)]


class MedusaObjective:
    """Medusa-1 (the comparator): frozen base, the heads train on its cached last hidden states
    over a random segment of positions per sequence, loss sum_k 0.8^(k-1) NLL_k."""

    terms, scale = "heads", 1.0

    def __init__(self, arch, heads, data: Dataset, val: list[Example], cfg, cache_bytes: int):
        self.arch, self.module, self.data, self.cfg = arch, heads, data, cfg
        self.val, self.cache_bytes, self.kept = val, cache_bytes, {}
        self.val_hidden = [final_hidden(arch, mx.array(ex.ids)) for ex in val]
        mx.eval(self.val_hidden)

    def _hidden(self, i: int) -> mx.array:
        if i in self.kept:
            return self.kept[i]
        h = final_hidden(self.arch, mx.array(self.data.examples[i].ids))
        mx.eval(h)
        if sum(x.nbytes for x in self.kept.values()) + h.nbytes <= self.cache_bytes:
            self.kept[i] = h
        return h

    def loss(self, module, i: int, seen: int):
        ex = self.data.examples[i]
        rng = np.random.RandomState([self.cfg.seed, seen])
        every = stream_positions(np.array(ex.loss_mask), module.config.n_heads)
        total, nlls = medusa_loss(
            module, self._hidden(i), ex, segment(every, self.cfg.segment, rng)
        )
        return total, mx.stack(nlls)

    def validate(self) -> dict:
        """Per-head top-1 accuracy and tau estimates, scored like the streams'."""

        def logits_of(i, rows):
            return self.module(self.val_hidden[i][mx.array(rows)]).transpose(1, 0, 2)

        cfg = self.module.config
        return asdict(validate(self.val, logits_of, cfg.n_heads, cfg.top_k))


def describe(validation: dict, top_k: int | None) -> str:
    """One log line for a validation record of any objective."""
    if "stream_accuracy" in validation:
        return (
            f"stream top-1 {validation['stream_accuracy']} tau chain {validation['tau_chain']} "
            f"tau top-{top_k} tree {validation['tau_tree']}"
        )
    return (
        f"next-token NLL {validation['next_token_nll']} top-1 {validation['next_token_accuracy']}"
    )


@dataclass
class Hooks:
    """What `train` reports to, and when it stops early: `log` takes its lines (`log_steps=False`
    leaves the per-step line out; validations and resumes are still logged), `on_step` follows
    every step (a progress bar), `stop_after` ends the run after that many steps of this call
    (as an interruption would), leaving the checkpoint."""

    log: Callable[[str], None] = print
    stop_after: int | None = None
    on_step: Callable[[StepReport], None] | None = None
    log_steps: bool = True


def train(
    loaded,
    params: StreamParams | None,
    data: Dataset,
    val: list[Example],
    out_dir: str | Path,
    cfg: TrainConfig,
    hooks: Hooks | None = None,
    medusa=None,
    feature_cache_bytes: int = 3 << 30,
) -> dict:
    """Train `params` on `data`: lossless mode leaves the base model untouched; shared mode
    trains LoRA layers on `loaded.model` too (put there with `apply_lora` first). params=None
    trains the next-token LoRA baseline: the model's LoRA layers alone.

    Resumes from `{out_dir}.checkpoint/` when present; `hooks` take its reports (default: its
    lines printed). Lossless mode keeps the frozen base's features of up to
    `feature_cache_bytes` of training sequences between epochs. `medusa` (MedusaHeads, params
    None) trains Medusa-1 heads on the frozen base instead.
    Returns the progress record: losses, validations, timing.
    """
    out_dir, hooks = Path(out_dir), hooks or Hooks()
    arch = arch_of(loaded.model, loaded.config["model_type"])
    on_model = lora_settings(loaded.model)
    if medusa is not None:
        if on_model or params is not None:
            raise SpecstreamError("medusa heads train on the plain base: no LoRA, no streams")
    elif params is None and len(on_model) != 1:
        raise SpecstreamError(
            f"the next-token baseline trains the model's LoRA layers; it has {on_model or 'none'}:"
            " call apply_lora first"
        )
    if params is not None and params.config.mode == "shared":
        want = {(params.config.lora_rank, params.config.lora_scale)}
        if on_model != want:
            raise SpecstreamError(
                f"shared mode trains LoRA layers {want} on the model, which has "
                f"{on_model or 'none'}: call apply_lora with that rank and scale first"
            )
    if cfg.parents_only and (params is None or not params.config.parent_rank):
        raise SpecstreamError("parents_only trains parent heads: the streams have none")
    bottom = Bottom(arch, _frozen_blocks(arch, params, medusa, cfg), feature_cache_bytes)
    if medusa is not None:
        objective = MedusaObjective(arch, medusa, data, val, cfg, feature_cache_bytes)
    elif params is None:
        objective = NextTokenObjective(loaded.model, data, val, bottom)
    elif params.config.mode == "lossless" and on_model:
        raise SpecstreamError("lossless training needs the base model without LoRA layers")
    elif cfg.parents_only:
        objective = parent_objective(arch, params, data, val, cfg, feature_cache_bytes)
    elif params.config.mode == "shared":
        objective = SharedObjective(arch, params, loaded.model, data, val, bottom)
    else:
        objective = LosslessObjective(arch, params, data, val, cfg, feature_cache_bytes)
    what = (
        params.config.to_dict()
        if params
        else {"medusa": asdict(medusa.config)}
        if medusa
        else {"next_token_lora": [list(s) for s in sorted(on_model)]}
    )
    top_k = params.config.top_k if params else medusa.config.top_k if medusa else None
    with training_top_lora(loaded.model, bottom.blocks):
        return _run(objective, what, top_k, out_dir, cfg, hooks)


def _frozen_blocks(arch, params: StreamParams | None, medusa, cfg: TrainConfig) -> int:
    """Blocks below the LoRA that trains (cfg.lora_layers; 0: it trains in every block)."""
    if not cfg.lora_layers:
        return 0
    n_layers = len(arch.layers)
    if medusa is not None or (params is not None and params.config.mode != "shared"):
        raise SpecstreamError("lora_layers is for the LoRA of shared and next-token training")
    lowest = params.config.n_msa_layers if params is not None else 1
    if not lowest <= cfg.lora_layers <= n_layers:
        raise SpecstreamError(
            f"lora_layers must be in [{lowest}, {n_layers}] (at least the MSA layers), "
            f"got {cfg.lora_layers}"
        )
    return n_layers - cfg.lora_layers


def _differences(then: dict | None, now: dict | None) -> list[str]:
    """'name: then -> now' for each setting that differs (the whole value where not dicts)."""
    if not isinstance(then, dict) or not isinstance(now, dict):
        return [] if then == now else [f"{then!r} -> {now!r}"]
    return [
        f"{k}: {then.get(k)!r} -> {now.get(k)!r}"
        for k in sorted(then.keys() | now.keys())
        if then.get(k, ...) != now.get(k, ...)
    ]


def _run(objective, what: dict, top_k: int | None, out_dir: Path, cfg, hooks: Hooks) -> dict:
    """The training loop of `train` over `objective`; `what` describes the trained parameters
    (the checkpoint must match it), `top_k` the drafters' for validation lines."""
    module, data, log = objective.module, objective.data, hooks.log
    checkpoint = Checkpoint(out_dir)
    progress = {
        "step": 0,
        "examples_seen": 0,
        "history": [],
        "validations": [],
        "train_config": asdict(cfg),
        "seconds": 0.0,
        "target_tokens": 0,
        "embedding_scale": objective.scale,
        "stream_config": what,
    }
    optimizer = make_optimizer(cfg, progress["embedding_scale"])
    if checkpoint.exists():
        saved = checkpoint.progress()
        if not 0 <= saved["step"] <= cfg.steps:
            raise checkpoint.unreadable(f"it is at step {saved['step']} of {cfg.steps}")
        # settings added since the checkpoint was made ran as their defaults then
        made_with = {**asdict(TrainConfig()), **(saved.get("train_config") or {})}
        made_what = as_it_ran(saved.get("stream_config"), what)
        differ = _differences(made_with, progress["train_config"]) + _differences(made_what, what)
        if differ:
            raise SpecstreamError(
                f"checkpoint {checkpoint.path} was made with other settings ("
                + "; ".join(differ[:5])
                + "); remove it or use the same flags"
            )
        progress = checkpoint.load(module, optimizer)
        progress["train_config"], progress["stream_config"] = made_with, what
        log(f"resuming from step {progress['step']} ({checkpoint.path})")

    loss_and_grad = nn.value_and_grad(module, objective.loss)
    done_here = 0
    while progress["step"] < cfg.steps:
        start = time.perf_counter()
        grads, losses, per_term, tokens = None, [], [], 0
        for _ in range(cfg.batch_size):
            i = _example_order(len(data), progress["examples_seen"], cfg.seed)
            progress["examples_seen"] += 1
            (loss, nlls), g = loss_and_grad(module, i, progress["examples_seen"])
            grads = g if grads is None else tree_map(mx.add, grads, g)
            losses.append(loss)
            per_term.append(nlls)
            tokens += len(data.examples[i].ids)
            mx.eval(grads, loss, nlls)  # bound the graph to one sequence
        grads = tree_map(lambda x: x / cfg.batch_size, grads)
        loss = mx.stack(losses).mean()
        nll = mx.stack(per_term).mean(axis=0).tolist()
        mx.eval(loss, grads)
        if not math.isfinite(loss.item()):
            raise SpecstreamError(
                f"loss is {loss.item()} at step {progress['step'] + 1}: stopped; the last good "
                f"checkpoint is {checkpoint.path if checkpoint.exists() else 'none'}"
            )
        optimizer.update(module, grads)
        mx.eval(module.trainable_parameters(), optimizer.state)
        seconds = time.perf_counter() - start
        progress["step"] += 1
        progress["seconds"] += seconds
        progress["target_tokens"] += tokens
        progress["history"].append({"step": progress["step"], "loss": round(loss.item(), 4)})
        if hooks.log_steps:
            log(
                f"step {progress['step']}/{cfg.steps} loss {loss.item():.4f} nll "
                f"({objective.terms}) [{', '.join(f'{x:.2f}' for x in nll)}] "
                f"{tokens / seconds:.0f} tokens/s"
            )
        if hooks.on_step:
            hooks.on_step(StepReport(progress["step"], cfg.steps, loss.item(), tokens, seconds))
        if progress["step"] % cfg.val_every == 0 or progress["step"] == cfg.steps:
            v = objective.validate()
            progress["validations"].append({"step": progress["step"], **v})
            log(f"validation step {progress['step']}: {describe(v, top_k)}")
        if progress["step"] % cfg.checkpoint_every == 0 or progress["step"] == cfg.steps:
            checkpoint.save(module, optimizer, progress)
        done_here += 1
        if hooks.stop_after is not None and done_here >= hooks.stop_after:
            break
    return progress
