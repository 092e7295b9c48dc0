"""StreamConfig: the shape of the speculative streams and of the tree they draft."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import SpecstreamError

MODES = ("lossless", "shared")
FORMAT_VERSION = 1  # adapter_config.json's format_version


@dataclass(frozen=True)
class StreamConfig:
    gamma: int = 4  # speculative streams per token; stream j predicts the token j after the next
    n_msa_layers: int = 4  # N_s: the top layers that run main stream and streams together
    top_k: int = 3  # tokens taken from each stream's logits to grow the tree
    max_tree_nodes: int = 32  # node cap after pruning (root included)
    prune_threshold: float = 0.0  # drop a child whose early-exit transition probability is lower
    stream_adapter_rank: int = 8
    prune_rank: int = 8
    mode: str = "lossless"  # lossless: frozen base; shared: LoRA in all layers (main_reads_streams)
    lora_rank: int = 8  # shared mode: rank of the LoRA adapters in every layer
    lora_scale: float = 20.0  # shared mode: LoRA output scale (mlx-lm's; PEFT's alpha / r)
    # Shared mode: the blocks whose LoRA the adapter's file holds; the others' LoRA is zero (an
    # adapter trained with LoRA in its top blocks only) and is not stored. None: every block.
    lora_blocks: tuple[int, ...] | None = None
    # Shared mode: prompt tokens carry streams too (the main stream attends to them). The paper
    # runs streams only from the last prompt token on (Appendix I), so the prompt is prefilled
    # plainly; adapters saved before this field existed ran them everywhere (from_dict).
    prompt_streams: bool = False
    # Shared mode: the streams also get their own low-rank adapters in the MSA layers (as in
    # lossless mode), on top of the LoRA they share with the main stream. With LoRA alone the
    # streams learned little (docs/BENCHMARKS.md); adapters saved before this field had none.
    shared_stream_adapters: bool = True
    # Shared mode: the main stream attends to the streams in the MSA layers (the paper). False:
    # it does not, so the main stream is the base with the LoRA alone and speculation is
    # lossless against it: the streams of a task LoRA that must keep its answers exactly (for
    # instance lossless streams trained over the LoRA fused into the base; scripts/
    # pack_lora_streams.py). Adapters saved before this field existed had the paper's.
    main_reads_streams: bool = True
    # Streams that know the next token (issue 20, beyond the paper): the early-exit head's guess
    # for the next token (its argmax at the pruning point) is embedded, projected by a learned
    # (d, d) matrix and added to every stream's initial state, so stream 1 predicts the token
    # after a known one instead of two tokens blind. Costs one head pass on the stream nodes.
    next_token_guess: bool = False
    # Stream adapters on the attention path as well (issue 20's capacity ablation): a second
    # low-rank adapter per MSA layer updates the stream rows' normed attention input, so their
    # queries, keys and values change (one LoRA on q, k and v, tied through its low-rank map),
    # not only what the MLP path adds to them. Needs the streams' own (MLP-path) adapters.
    attention_adapters: bool = False
    # Streams that read their parent's token (issue 20, beyond the paper; as Hydra's heads read
    # theirs): after the MSA layers a low-rank head per stream adds to its last hidden state what
    # the token before its target tells it (stream 1: the main stream's greedy token at the
    # node, decided in the same pass; stream j: stream j-1's best token), so stream j guesses
    # the token after a known one. 0: none. Costs one head pass per drafted stream, in turn.
    parent_rank: int = 0
    # The streams draft from these token ids only (sorted; the commonest targets of the
    # adapter's training data): their head pass reads K of the head's V columns, which matters
    # where it runs once per drafted stream (parent heads) or the vocabulary is large. Lossless
    # either way (the main stream keeps the whole head); a target outside it is never drafted.
    # None: the whole vocabulary.
    draft_vocab: tuple[int, ...] | None = None
    # A static sparse draft tree as rank paths ((0,), (1,), (0, 0), ...: node (i1..ij) holds the
    # i_j-th best token of stream j); None drafts every stream's top_k (then pruned). Chosen per
    # device from measured acceptance (calibration.tuned); never saved with an adapter.
    tree: tuple[tuple[int, ...], ...] | None = None

    @property
    def has_stream_adapters(self) -> bool:
        return self.mode == "lossless" or self.shared_stream_adapters

    @property
    def main_needs_streams(self) -> bool:
        """The main stream attends to the streams, so its tokens depend on them: every pass
        runs all gamma streams, and plain decoding is the model with its streams."""
        return self.mode == "shared" and self.main_reads_streams

    def validate(self, n_layers: int | None = None) -> StreamConfig:
        """Raise one SpecstreamError listing every out-of-range field."""
        _check_types(self)
        problems = []
        if not 1 <= self.gamma <= 16:
            problems.append(f"gamma must be in [1, 16], got {self.gamma}")
        if self.n_msa_layers < 1 or (n_layers is not None and self.n_msa_layers >= n_layers):
            limit = f"[1, {n_layers - 1}]" if n_layers else ">= 1"
            problems.append(f"n_msa_layers must be in {limit}, got {self.n_msa_layers}")
        if not 1 <= self.top_k <= 64:
            problems.append(f"top_k must be in [1, 64], got {self.top_k}")
        if self.max_tree_nodes < 1:
            problems.append(f"max_tree_nodes must be >= 1, got {self.max_tree_nodes}")
        if not 0 <= self.prune_threshold < 1:
            problems.append(f"prune_threshold must be in [0, 1), got {self.prune_threshold}")
        if self.stream_adapter_rank < 1 or self.prune_rank < 1:
            problems.append("stream_adapter_rank and prune_rank must be >= 1")
        if self.mode == "shared" and self.lora_rank < 1:
            problems.append(f"lora_rank must be >= 1 in shared mode, got {self.lora_rank}")
        if not 0 < self.lora_scale < float("inf"):
            problems.append(f"lora_scale must be a positive number, got {self.lora_scale}")
        problems += _blocks_problems(self.lora_blocks, n_layers)
        if not isinstance(self.prompt_streams, bool):
            problems.append(f"prompt_streams must be true or false, got {self.prompt_streams!r}")
        if not isinstance(self.shared_stream_adapters, bool):
            problems.append(
                f"shared_stream_adapters must be true or false, got {self.shared_stream_adapters!r}"
            )
        if not isinstance(self.main_reads_streams, bool):
            problems.append(
                f"main_reads_streams must be true or false, got {self.main_reads_streams!r}"
            )
        elif self.prompt_streams is True and self.mode == "shared" and not self.main_reads_streams:
            problems.append("prompt_streams needs a shared-mode main stream that reads them")
        if not isinstance(self.next_token_guess, bool):
            problems.append(
                f"next_token_guess must be true or false, got {self.next_token_guess!r}"
            )
        if not isinstance(self.attention_adapters, bool):
            problems.append(
                f"attention_adapters must be true or false, got {self.attention_adapters!r}"
            )
        elif self.attention_adapters and not self.has_stream_adapters:
            problems.append("attention_adapters needs the streams' own adapters")
        if not isinstance(self.parent_rank, int) or self.parent_rank < 0:
            problems.append(f"parent_rank must be a whole number >= 0, got {self.parent_rank!r}")
        problems += _vocab_problems(self.draft_vocab, self.top_k)
        if self.tree is not None:
            problems += _tree_problems(self.tree, self.gamma)
            if any(r >= self.top_k for path in self.tree for r in path):
                problems.append(f"tree ranks must be below top_k ({self.top_k})")
            if self.max_tree_nodes < len(self.tree) + 1:
                problems.append(f"max_tree_nodes must hold the tree's {len(self.tree) + 1} nodes")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if problems:
            raise SpecstreamError("bad stream config: " + "; ".join(problems))
        return self

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["tree"]  # a device's choice, not part of the adapter
        return out

    @classmethod
    def from_dict(cls, data: dict) -> StreamConfig:
        known = {f.name for f in fields(cls)}
        if data.get("mode") == "shared" and "main_reads_streams" not in data:
            # adapters made before these fields existed (main_reads_streams came last)
            data = {"prompt_streams": True, "shared_stream_adapters": False, **data}
        unknown = sorted(set(data) - known - {"tree"})
        if unknown:  # a typo would otherwise fall back to a default silently
            raise ValueError(f"unknown stream_config field(s) {', '.join(map(str, unknown))}")
        out = {k: v for k, v in data.items() if k != "tree"}
        for name in ("lora_blocks", "draft_vocab"):
            if isinstance(out.get(name), list):
                out[name] = tuple(out[name])
        return cls(**out)


def as_it_ran(saved, now: dict):
    """A checkpoint's stream config with the StreamConfig fields added since it was made (absent
    from it, present in `now`) at their defaults, as they ran then; anything else as it is."""
    if not isinstance(saved, dict) or not isinstance(now, dict) or "mode" not in now:
        return saved
    added = {
        f.name: f.default for f in fields(StreamConfig) if f.name in now and f.name not in saved
    }
    return {**saved, **added}


_WHOLE = ("gamma", "n_msa_layers", "top_k", "max_tree_nodes", "stream_adapter_rank", "prune_rank",
          "lora_rank", "parent_rank")  # fmt: skip
_REAL = ("prune_threshold", "lora_scale")


def _check_types(cfg: StreamConfig) -> None:
    """Numbers where numbers belong (a config file may say "four"), before any comparison."""
    problems = [
        f"{name} must be a whole number, got {getattr(cfg, name)!r}"
        for name in _WHOLE
        if type(getattr(cfg, name)) is not int
    ]
    problems += [
        f"{name} must be a number, got {getattr(cfg, name)!r}"
        for name in _REAL
        if type(getattr(cfg, name)) not in (int, float)
    ]
    if problems:
        raise SpecstreamError("bad stream config: " + "; ".join(problems))


def _blocks_problems(blocks, n_layers: int | None) -> list[str]:
    if blocks is None:
        return []
    ok = isinstance(blocks, tuple) and all(type(b) is int for b in blocks)
    if ok and list(blocks) == sorted(set(blocks)) and all(b >= 0 for b in blocks):
        if n_layers is None or all(b < n_layers for b in blocks):
            return []
        return [f"lora_blocks {blocks!r} names blocks the model lacks (its {n_layers}: 0 on)"]
    return [f"lora_blocks must be increasing block indices, got {blocks!r}"]


def _vocab_problems(vocab, top_k: int) -> list[str]:
    if vocab is None:
        return []
    ok = isinstance(vocab, tuple) and all(type(t) is int and t >= 0 for t in vocab)
    if ok and list(vocab) == sorted(set(vocab)) and len(vocab) >= top_k:
        return []
    return [f"draft_vocab must be at least top_k ({top_k}) increasing token ids"]


def _tree_problems(tree, gamma: int) -> list[str]:
    """Rank paths must be non-empty tuples of ranks in [0, 64), at most gamma deep, each path's
    parent listed before it."""
    seen: set[tuple[int, ...]] = {()}
    for path in tree:
        ok = (
            isinstance(path, tuple)
            and 1 <= len(path) <= gamma
            and all(isinstance(r, int) and 0 <= r < 64 for r in path)
        )
        if not ok or path[:-1] not in seen or path in seen:
            return [f"tree path {path!r} is not a new rank path under a listed parent"]
        seen.add(path)
    return []


def saved_stream_config(config: dict, where) -> StreamConfig:
    """The StreamConfig an adapter's saved config holds (adapter_config.json, or the PyTorch
    path's stream_config.json), its format version and fields checked; `where` names the file
    in errors. The layer count is checked later, against the model."""
    version = config.get("format_version", FORMAT_VERSION)
    if type(version) is not int:
        raise SpecstreamError(
            f"unreadable {where}: format_version must be an integer, got {version!r}"
        )
    if not 1 <= version <= FORMAT_VERSION:
        raise SpecstreamError(
            f"unreadable {where}: format_version {version}; this version of specstream-mlx "
            f"reads format {FORMAT_VERSION} (a newer one needs a newer release)"
        )
    if "stream_config" not in config:
        raise SpecstreamError(f"unreadable {where}: no stream_config")
    if not isinstance(config["stream_config"], dict):
        raise SpecstreamError(f"unreadable {where}: stream_config must be an object")
    try:
        return StreamConfig.from_dict(config["stream_config"]).validate()
    except (ValueError, KeyError, TypeError, AttributeError, SpecstreamError) as exc:
        raise SpecstreamError(f"unreadable {where}: {exc}") from None


def next_token_config(num_layers: int, rank: int, scale: float, base_model: dict) -> dict:
    """A next-token LoRA folder's adapter_config.json: mlx-lm's fields (its LoRA in the top
    `num_layers` blocks) and the base it was trained on."""
    return {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0},
        "format_version": FORMAT_VERSION,
        "base_model": base_model,
    }


def next_token_settings(config: dict, where) -> tuple[int, float, int]:
    """A next-token LoRA folder's rank, scale and block count (mlx-lm's `num_layers`: its top
    blocks; -1: all) from its adapter_config.json `config`; `where` names the file in errors."""
    lora = config.get("lora_parameters")
    lora = lora if isinstance(lora, dict) else {}
    rank, scale, blocks = lora.get("rank"), lora.get("scale"), config.get("num_layers")
    if type(rank) is not int or rank < 1 or type(scale) not in (int, float):
        raise SpecstreamError(f"unreadable {where}: lora_parameters needs rank and scale")
    if type(blocks) is not int or not (blocks == -1 or blocks >= 1):
        raise SpecstreamError(
            f"unreadable {where}: num_layers must be a block count >= 1 or -1 (all), got {blocks!r}"
        )
    return rank, float(scale), blocks
