"""The public generation API: one streaming generator, and `generate` that collects it.

A decoder yields, per forward pass, the list of tokens that pass accepted (always one token for
plain decoding). Everything users see is handled here, the same for every decoder: the prompt
and chat template, stop at EOS (even inside an accepted list), the max-token cut, streaming
detokenization, and statistics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from .decoding.lookup import LookupConfig, lookup_draft
from .decoding.plain import plain_decode
from .decoding.speculative import compiled_passes, speculative_decode
from .decoding.tree import draft_depth, draft_tree
from .errors import SpecstreamError
from .models.arch import SUPPORTED, arch_of
from .models.loader import LoadedModel
from .sampling import Sampler, SamplingParams
from .streams.config import StreamConfig
from .streams.lora import current_lora
from .streams.params import StreamParams

DECODERS = ("ar", "ss", "pld", "ss+pld")
TREE_CHOICES = ("auto", "adapter")


@dataclass
class GenerationStats:
    """Counters of one generation; `mean_accepted_tokens` is the paper's tau."""

    prompt_tokens: int = 0
    generated_tokens: int = 0  # tokens in the output (a final EOS is not output)
    accepted_tokens: int = 0  # tokens the passes decided, a final EOS included
    forward_passes: int = 0  # decoding passes; the prefill pass that yields the first token counts
    tree_nodes: int = 0  # drafted tree nodes over all passes, before pruning
    tree_nodes_kept: int = 0  # after pruning
    prompt_seconds: float = 0.0  # time to the first token (prefill included)
    wall_seconds: float = 0.0
    tree: dict | None = None  # speculative decoders: the draft tree used and where it came from

    @property
    def mean_accepted_tokens(self) -> float:
        return self.accepted_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decoding speed: tokens after the first, over the time after the first token."""
        decode_seconds = self.wall_seconds - self.prompt_seconds
        if self.generated_tokens < 2 or decode_seconds <= 0:
            return 0.0
        return (self.generated_tokens - 1) / decode_seconds

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mean_accepted_tokens"] = round(self.mean_accepted_tokens, 4)
        out["tokens_per_second"] = round(self.tokens_per_second, 3)
        out["prompt_seconds"] = round(self.prompt_seconds, 4)
        out["wall_seconds"] = round(self.wall_seconds, 4)
        if self.tree is None:
            del out["tree"]
        return out


@dataclass
class GenerationChunk:
    """One step of `stream_generate`: the new text and tokens, and the running statistics."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str | None = None  # "stop" (EOS) | "length" (max tokens or context) | None


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats
    decoder: str
    model: str
    adapter: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The `specstream generate --json` contract."""
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "decoder": self.decoder,
            "model": self.model,
            "adapter": self.adapter,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


def default_streams(loaded: LoadedModel, config: StreamConfig | None = None) -> StreamParams:
    """Untrained streams for `loaded`, made once and kept on it."""
    if loaded.streams is None:
        config = (config or StreamConfig()).validate(loaded.config["num_hidden_layers"])
        loaded.streams = StreamParams(config, loaded.config["hidden_size"])
        mx.eval(loaded.streams.parameters())
    return loaded.streams


def encode_prompt(loaded: LoadedModel, prompt: str | list[dict], chat: bool | None = None):
    """Token ids for a prompt string (or a list of chat messages).

    chat=None uses the chat template when the model has one; chat=False feeds the text as is.
    """
    tokenizer = loaded.tokenizer
    if isinstance(prompt, str):
        if not prompt.strip():
            raise SpecstreamError("the prompt is empty")
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = prompt
        if not messages:
            raise SpecstreamError("the message list is empty")
    use_chat = tokenizer.has_chat_template if chat is None else chat
    if use_chat:
        if not tokenizer.has_chat_template:
            raise SpecstreamError(f"model {loaded.name} has no chat template")
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if not isinstance(prompt, str):
        raise SpecstreamError("chat messages need chat=True")
    return list(tokenizer.encode(prompt, add_special_tokens=True))


def stream_generate(
    loaded: LoadedModel,
    prompt: str | list[dict] | list[int],
    *,
    max_tokens: int = 256,
    sampling: SamplingParams | None = None,
    decoder: str = "ar",
    chat: bool | None = None,
    streams: StreamParams | None = None,
    kv_bits: int | None = None,
    draft_override=None,
    drafter=None,
    tree: str = "auto",
    compile: bool | None = None,
) -> Iterator[GenerationChunk]:
    """Generate from `prompt` (text, chat messages, or token ids), yielding text as it is decided.

    Stops at an EOS token (not included in the output), after `max_tokens` tokens, or when the
    model's context is full. decoder "ss" is Speculative Streaming with `streams` (default:
    untrained streams, which keep the output exact but accept few tokens); "ss+pld" drafts the
    prompt-lookup chain when the context has a match, the streams' tokens otherwise; "pld" is prompt
    lookup decoding (drafts copied from the context, verified by the model: lossless), or
    verification of the trees another `drafter` proposes (decoding.speculative.Drafter, e.g.
    Medusa heads).

    tree="auto" (greedy "ss" / "ss+pld"): when the streams carry acceptance statistics, draft
    the static tree that decodes fastest on this device (calibration.tuned: the latency curve is
    measured once per device and model and cached); when no tree beats one token per pass,
    lossless streams are not run at all ("ss" decodes plainly, "ss+pld" as "pld"). tree="adapter"
    drafts the streams' own tree (their top_k, node cap and pruning).

    compile: run greedy "ss" / "ss+pld" passes and plain decoding steps as compiled graphs
    (decoding.compiled); None decides by this device's calibration (compiled where it measured
    faster; without a calibration: on Metal and CUDA, off on a CPU).
    """
    if tree not in TREE_CHOICES:
        raise SpecstreamError(f"tree must be one of {', '.join(TREE_CHOICES)}, got {tree!r}")
    if decoder not in DECODERS:
        raise SpecstreamError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if kv_bits not in (None, 4, 8):
        raise SpecstreamError(f"kv_bits must be 4 or 8 (or None), got {kv_bits}")
    if max_tokens < 1:
        raise SpecstreamError(f"max_tokens must be >= 1, got {max_tokens}")
    sampling = sampling or SamplingParams()
    if prompt and isinstance(prompt, list) and isinstance(prompt[0], int):
        prompt_ids = list(prompt)
    else:
        prompt_ids = encode_prompt(loaded, prompt, chat)
    if not prompt_ids:
        raise SpecstreamError("the prompt is empty")
    room = loaded.context_length - len(prompt_ids)
    if room < 1:
        raise SpecstreamError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds "
            f"{loaded.context_length}"
        )
    budget = min(max_tokens, room)
    if compile is None:
        compile = _compile_default(loaded)

    stats = GenerationStats(prompt_tokens=len(prompt_ids))
    detokenizer = loaded.tokenizer.detokenizer
    detokenizer.reset()
    if decoder in ("ss", "ss+pld"):  # before the clock: the first use may calibrate the device
        params = streams or default_streams(loaded)
        params, stats.tree = _tree_for(loaded, params, tree, sampling, draft_override)
        if stats.tree.get("nodes") == 1 and params.config.mode == "lossless":
            # one token per pass is fastest here: the streams would only cost time
            decoder, params = ("pld" if decoder == "ss+pld" else "ar"), None
    start = time.perf_counter()
    if decoder in ("ss", "ss+pld"):
        arch = arch_of(loaded.model, loaded.config["model_type"])
        lookup = LookupConfig() if decoder == "ss+pld" else None
        steps = speculative_decode(
            loaded.model,
            arch,
            params,
            prompt_ids,
            budget,
            draft_override,
            kv_bits,
            lookup=lookup,
            sampling=sampling,
            compiled=compile,
        )
    elif decoder == "pld":
        arch = arch_of(loaded.model, loaded.config["model_type"])
        lookup = LookupConfig()
        if _shared(loaded):
            # The adapter's own model verifies: its streams run (the main stream attends to
            # them) but draft nothing (a 1-node cap); the lookup's chain is the whole draft.
            if drafter is not None:
                raise SpecstreamError("a drafter verifies on the base model, not a shared adapter")
            shared = loaded.streams.with_config(top_k=1, max_tree_nodes=1)
            steps = speculative_decode(
                loaded.model,
                arch,
                shared,
                prompt_ids,
                budget,
                kv_bits=kv_bits,
                lookup=lookup,
                sampling=sampling,
            )
        else:
            drafter = drafter or (
                lambda h, _: draft_tree(h[-1], [[t] for t in lookup_draft(h, lookup)])
            )
            steps = speculative_decode(
                loaded.model,
                arch,
                None,
                prompt_ids,
                budget,
                kv_bits=kv_bits,
                drafter=drafter,
                sampling=sampling,
            )
    elif _shared(loaded):
        # A shared-mode adapter changes the model itself: its main stream attends to its own
        # streams, so plain decoding runs them too (one token per pass, no draft).
        arch = arch_of(loaded.model, loaded.config["model_type"])
        steps = speculative_decode(
            loaded.model,
            arch,
            loaded.streams,
            prompt_ids,
            budget,
            None,
            kv_bits,
            draft=False,
            sampling=sampling,
            compiled=compile,
        )
    else:
        passes = None
        supported = loaded.config["model_type"] in SUPPORTED
        if compile and supported and current_lora(loaded.model) is None:  # LoRA may be swapped
            arch = arch_of(loaded.model, loaded.config["model_type"])
            passes = compiled_passes(arch, None)
        steps = plain_decode(loaded.model, prompt_ids, budget, Sampler(sampling), kv_bits, passes)
    for step in steps:
        accepted = step.tokens
        stats.forward_passes += 1
        stats.tree_nodes += step.tree_nodes
        stats.tree_nodes_kept += step.tree_nodes_kept
        if stats.forward_passes == 1:
            stats.prompt_seconds = time.perf_counter() - start
        finish = None
        kept = []
        for token in accepted:
            stats.accepted_tokens += 1
            if token in loaded.eos_token_ids:
                finish = "stop"
                break
            kept.append(token)
            detokenizer.add_token(token)
            if stats.generated_tokens + len(kept) == budget:
                finish = "length"
                break
        stats.generated_tokens += len(kept)
        stats.wall_seconds = time.perf_counter() - start
        if finish is not None:
            detokenizer.finalize()
        yield GenerationChunk(detokenizer.last_segment, kept, stats, finish)
        if finish is not None:
            steps.close()
            return


def generate(
    loaded: LoadedModel,
    prompt: str | list[dict] | list[int],
    *,
    max_tokens: int = 256,
    sampling: SamplingParams | None = None,
    decoder: str = "ar",
    chat: bool | None = None,
    streams: StreamParams | None = None,
    kv_bits: int | None = None,
    tree: str = "auto",
    compile: bool | None = None,
) -> GenerationResult:
    """Run `stream_generate` to the end and return the whole text, token ids and statistics."""
    pieces, tokens, finish, stats = [], [], "length", GenerationStats()
    for chunk in stream_generate(
        loaded,
        prompt,
        max_tokens=max_tokens,
        sampling=sampling,
        decoder=decoder,
        chat=chat,
        streams=streams,
        kv_bits=kv_bits,
        tree=tree,
        compile=compile,
    ):
        pieces.append(chunk.text)
        tokens.extend(chunk.token_ids)
        stats = chunk.stats
        finish = chunk.finish_reason or finish
    return GenerationResult(
        text="".join(pieces),
        token_ids=tokens,
        finish_reason=finish,
        stats=stats,
        decoder=decoder,
        model=loaded.name,
        adapter=loaded.adapter if decoder in ("ss", "ss+pld") or _shared(loaded) else None,
    )


def _compile_default(loaded: LoadedModel) -> bool:
    from .backend import device_name
    from .calibration import latency_curve

    curve = latency_curve(loaded, measure=False)  # kept on `loaded` once read
    if curve is not None:
        return curve.compiled
    return not device_name().startswith("cpu")


def _tree_for(loaded, params, tree: str, sampling, draft_override) -> tuple:
    """The streams to decode with and the --json stats' description of their tree."""
    from .calibration import tuned

    plan = None
    if tree == "auto" and sampling.greedy and draft_override is None:
        params, plan = tuned(loaded, params)
    if plan is not None:
        return params, {"source": "calibrated", **plan.to_dict()}
    cfg = params.config
    return params, {
        "source": "adapter",
        "top_k": cfg.top_k,
        "max_tree_nodes": cfg.max_tree_nodes,
        "prune_threshold": cfg.prune_threshold,
        "depth": draft_depth(cfg),
    }


def _shared(loaded: LoadedModel) -> bool:
    """A shared-mode adapter is loaded: every decoder runs its model."""
    return loaded.streams is not None and loaded.streams.config.mode == "shared"
