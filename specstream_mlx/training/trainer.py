"""The training loop for stream adapters: AdamW with warmup and linear decay, gradient
accumulation over sequences, periodic validation (per-stream top-1 accuracy, estimated tau),
atomic resumable checkpoints, and a stop that keeps the last good checkpoint on a NaN loss."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from ..errors import SpecstreamError
from ..models.arch import arch_of
from ..streams.params import StreamParams
from .data import Dataset, Example
from .forward import (
    BaseFeatures,
    base_features,
    segment,
    stream_hidden,
    stream_loss,
    stream_positions,
)


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


@dataclass
class Validation:
    stream_accuracy: list[float]  # top-1 accuracy of stream j = 1..gamma
    tau_chain: float  # estimated accepted tokens per pass with a k=1 chain
    tau_tree: float  # ... with every stream's top-k in the tree
    positions: int


def _example_order(n: int, index: int, seed: int) -> int:
    epoch, offset = divmod(index, n)
    return int(np.random.RandomState(seed + epoch).permutation(n)[offset])


def _leading_true(hits: np.ndarray) -> np.ndarray:
    """(P, gamma) bool -> (P,) length of the leading run of True per row."""
    return np.cumprod(hits, axis=1).sum(axis=1)


def validate(arch, params: StreamParams, features: list[BaseFeatures]) -> Validation:
    """Streams' greedy and top-k hits on held-out sequences, where all gamma targets exist."""
    cfg = params.config
    top1, topk = [], []
    for feats in features:
        mask, t = feats.loss_mask, len(feats.loss_mask)
        # position p is scored when tokens p+1 .. p+1+gamma are all completion tokens
        rows = [p for p in range(t - 1 - cfg.gamma) if mask[p + 1 : p + 2 + cfg.gamma].all()]
        if not rows:
            continue
        hidden = stream_hidden(arch, params, feats, np.array(rows))  # (P, gamma, d)
        logits = arch.lm_head(arch.norm(hidden))  # (P, gamma, V)
        ids = np.array(feats.ids)
        targets = np.array([[ids[p + 1 + j] for j in range(1, cfg.gamma + 1)] for p in rows])
        best = np.array(mx.argpartition(-logits, cfg.top_k - 1, axis=-1)[..., : cfg.top_k])
        top1.append(np.array(mx.argmax(logits, axis=-1)) == targets)
        topk.append((best == targets[..., None]).any(-1))
    if not top1:
        raise SpecstreamError("no validation position has gamma completion tokens after it")
    top1, topk = np.concatenate(top1), np.concatenate(topk)
    return Validation(
        stream_accuracy=[round(float(a), 4) for a in top1.mean(axis=0)],
        tau_chain=round(1 + float(_leading_true(top1).mean()), 4),
        tau_tree=round(1 + float(_leading_true(topk).mean()), 4),
        positions=int(top1.shape[0]),
    )


class FeatureCache:
    """The frozen base's features of each training sequence, computed on first use and kept
    while they fit in `max_bytes` (a later epoch then runs only the streams)."""

    def __init__(self, arch, n_msa_layers: int, examples: list[Example], max_bytes: int):
        self.arch, self.n_msa_layers, self.examples = arch, n_msa_layers, examples
        self.max_bytes, self.nbytes = max_bytes, 0
        self.kept: dict[int, BaseFeatures] = {}

    def __getitem__(self, i: int) -> BaseFeatures:
        if i in self.kept:
            return self.kept[i]
        ex = self.examples[i]
        feats = base_features(self.arch, self.n_msa_layers, ex.ids, ex.loss_mask)
        if self.nbytes + feats.nbytes <= self.max_bytes:
            self.kept[i] = feats
            self.nbytes += feats.nbytes
        return feats


class Checkpoint:
    """`{out}.checkpoint/`: stream parameters, optimizer state and progress, replaced atomically."""

    def __init__(self, out_dir: Path):
        self.path = out_dir.with_name(out_dir.name + ".checkpoint")

    def exists(self) -> bool:
        return (self.path / "progress.json").is_file()

    def save(self, params, optimizer, progress: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        weights = dict(tree_flatten(params.parameters()))
        mx.save_safetensors(str(tmp / "params.safetensors"), weights)
        mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
        (tmp / "progress.json").write_text(json.dumps(progress, indent=2))
        old = self.path.with_name(self.path.name + ".old")
        if self.path.exists():
            os.replace(self.path, old)
        os.replace(tmp, self.path)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, params, optimizer) -> dict:
        params.update(tree_unflatten(list(mx.load(str(self.path / "params.safetensors")).items())))
        optimizer.state = tree_unflatten(
            list(mx.load(str(self.path / "optimizer.safetensors")).items())
        )
        return json.loads((self.path / "progress.json").read_text())

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def hidden_scale(features: list[BaseFeatures]) -> float:
    """Median per-token RMS of the hidden state at the pruning point."""
    rms = [np.array(mx.sqrt((f.h_low * f.h_low).mean(axis=-1))) for f in features]
    return float(np.median(np.concatenate(rms)))


def make_optimizer(cfg: TrainConfig, embedding_scale: float) -> optim.Optimizer:
    """AdamW with warmup and linear decay. Adam moves every weight by about the learning rate per
    step whatever the weight's scale; stream embeddings are added to hidden states of RMS
    `embedding_scale` (about 17 for SmolLM2), so their learning rate is scaled to match."""

    def schedule(lr: float):
        warmup = optim.linear_schedule(lr / 10, lr, max(cfg.warmup, 1))
        decay = optim.linear_schedule(lr, 0.0, max(cfg.steps - cfg.warmup, 1))
        return optim.join_schedules([warmup, decay], [max(cfg.warmup, 1)])

    lr = cfg.learning_rate
    embeddings = optim.AdamW(learning_rate=schedule(lr * embedding_scale), weight_decay=0.0)
    rest = optim.AdamW(learning_rate=schedule(lr), weight_decay=0.0)
    return optim.MultiOptimizer(
        [embeddings, rest], [lambda path, _: path.startswith("stream_embeddings")]
    )


def train(
    loaded,
    params: StreamParams,
    data: Dataset,
    val: list[Example],
    out_dir: str | Path,
    cfg: TrainConfig,
    log=print,
    stop_after: int | None = None,
    feature_cache_bytes: int = 3 << 30,
) -> dict:
    """Train `params` on `data` (lossless mode: the base model is never updated).

    Resumes from `{out_dir}.checkpoint/` when present. `stop_after` ends the run after that many
    steps of this call (as an interruption would), leaving the checkpoint. The frozen base's
    features of up to `feature_cache_bytes` of training sequences are kept between epochs.
    Returns the progress record: losses, validations, timing.
    """
    if params.config.mode != "lossless":
        raise SpecstreamError("only lossless training is implemented so far")
    out_dir = Path(out_dir)
    arch = arch_of(loaded.model, loaded.config["model_type"])
    n_msa, gamma = params.config.n_msa_layers, params.config.gamma
    features = FeatureCache(arch, n_msa, data.examples, feature_cache_bytes)
    val_features = [base_features(arch, n_msa, ex.ids, ex.loss_mask) for ex in val]
    checkpoint = Checkpoint(out_dir)
    progress = {
        "step": 0,
        "examples_seen": 0,
        "history": [],
        "validations": [],
        "train_config": asdict(cfg),
        "seconds": 0.0,
        "target_tokens": 0,
        "embedding_scale": hidden_scale(val_features),
    }
    optimizer = None
    if checkpoint.exists():
        saved = json.loads((checkpoint.path / "progress.json").read_text())
        optimizer = make_optimizer(cfg, saved.get("embedding_scale", progress["embedding_scale"]))
        progress = checkpoint.load(params, optimizer)
        if progress["train_config"] != asdict(cfg):
            raise SpecstreamError(
                f"checkpoint {checkpoint.path} was made with other settings; "
                "remove it or use the same flags"
            )
        log(f"resuming from step {progress['step']} ({checkpoint.path})")
    optimizer = optimizer or make_optimizer(cfg, progress["embedding_scale"])

    def loss_fn(p, feats, positions):
        out = stream_loss(arch, p, feats, positions)
        return out.total, mx.stack(out.stream_nll)

    loss_and_grad = nn.value_and_grad(params, loss_fn)
    done_here = 0
    while progress["step"] < cfg.steps:
        start = time.perf_counter()
        grads, losses, per_stream, tokens = None, [], [], 0
        for _ in range(cfg.batch_size):
            i = _example_order(len(data), progress["examples_seen"], cfg.seed)
            progress["examples_seen"] += 1
            feats = features[i]
            rng = np.random.RandomState([cfg.seed, progress["examples_seen"]])
            positions = segment(stream_positions(feats.loss_mask, gamma), cfg.segment, rng)
            (loss, nlls), g = loss_and_grad(params, feats, positions)
            grads = g if grads is None else tree_map(mx.add, grads, g)
            losses.append(loss)
            per_stream.append(nlls)
            tokens += len(data.examples[i].ids)
            mx.eval(grads, loss, nlls)  # bound the graph to one sequence
        grads = tree_map(lambda x: x / cfg.batch_size, grads)
        loss = mx.stack(losses).mean()
        stream_nll = mx.stack(per_stream).mean(axis=0).tolist()
        mx.eval(loss, grads)
        if not math.isfinite(loss.item()):
            raise SpecstreamError(
                f"loss is {loss.item()} at step {progress['step'] + 1}: stopped; the last good "
                f"checkpoint is {checkpoint.path if checkpoint.exists() else 'none'}"
            )
        optimizer.update(params, grads)
        mx.eval(params.parameters(), optimizer.state)
        seconds = time.perf_counter() - start
        progress["step"] += 1
        progress["seconds"] += seconds
        progress["target_tokens"] += tokens
        progress["history"].append({"step": progress["step"], "loss": round(loss.item(), 4)})
        log(
            f"step {progress['step']}/{cfg.steps} loss {loss.item():.4f} stream nll "
            f"[{', '.join(f'{x:.2f}' for x in stream_nll)}] {tokens / seconds:.0f} tokens/s"
        )
        if progress["step"] % cfg.val_every == 0 or progress["step"] == cfg.steps:
            v = validate(arch, params, val_features)
            progress["validations"].append({"step": progress["step"], **asdict(v)})
            log(
                f"validation step {progress['step']}: stream top-1 {v.stream_accuracy} "
                f"tau chain {v.tau_chain} tau top-{params.config.top_k} tree {v.tau_tree}"
            )
        if progress["step"] % cfg.checkpoint_every == 0 or progress["step"] == cfg.steps:
            checkpoint.save(params, optimizer, progress)
        done_here += 1
        if stop_after is not None and done_here >= stop_after:
            break
    return progress
