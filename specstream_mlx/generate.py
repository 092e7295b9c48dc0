"""The public generation API: one streaming generator, and `generate` that collects it.

A decoder yields, per forward pass, the list of tokens that pass accepted (always one token for
plain decoding). Everything users see is handled here, the same for every decoder: the prompt
and chat template, stop at EOS (even inside an accepted list), the max-token cut, streaming
detokenization, and statistics.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from .decoding.loop import decode
from .errors import SpecstreamError
from .models.loader import LoadedModel
from .prompts import encode_prompt
from .sampling import SamplingParams
from .session import DECODERS, TREE_CHOICES, Options, default_streams, resolve

__all__ = ["DECODERS", "TREE_CHOICES", "default_streams", "encode_prompt"]


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
    tree: dict | None = None  # speculative decoders: the draft tree and where it came from
    # (pld: {"source": "lookup"}), how the lookup drafts ("lookup": "chains" instead of the
    # streams' tree, "grafted" onto it) and whether its chains were gated ("lookup_gated")
    decoder: str = ""  # the decoder that ran (a lossless "ss" whose best tree is empty: "ar")
    first_pass_tokens: int = 0  # output tokens the first pass decided (prefill included)

    @property
    def mean_accepted_tokens(self) -> float:
        return self.accepted_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decoding speed: the tokens after the first pass's, over the time after it."""
        decode_seconds = self.wall_seconds - self.prompt_seconds
        later = self.generated_tokens - self.first_pass_tokens
        if later < 1 or decode_seconds <= 0:
            return 0.0
        return later / decode_seconds

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
    # "stop" (EOS) | "length" (max tokens or context) | "cancelled" (`stop` said so while the
    # prompt was prefilled: no token) | None
    finish_reason: str | None = None


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


def stream_generate(
    loaded: LoadedModel,
    prompt: str | list[dict] | list[int],
    *,
    max_tokens: int = 256,
    sampling: SamplingParams | None = None,
    chat: bool | None = None,
    **options,
) -> Iterator[GenerationChunk]:
    """Generate from `prompt` (text, chat messages, or token ids), yielding text as it is decided.

    Stops at an EOS token (not included in the output), after `max_tokens` tokens, or when the
    model's context is full. `options` (session.Options): decoder "ar" (plain), "ss"
    (Speculative Streaming with `streams`, default the loaded adapter's or untrained ones),
    "pld" (prompt lookup, or the trees another `drafter` proposes), "ss+pld" (greedy: the
    streams' tree with the lookup's chains grafted on; sampled: the lookup's chain when the
    context has a match, the streams' draft otherwise); tree "auto" (the tree
    calibrated for this device when the streams carry acceptance statistics) or "adapter";
    compile (None: as calibrated); kv_bits; draft_override (a test hook); stop (asked before
    each chunk of the prompt's prefill: True ends the generation there, with one chunk of no
    tokens, finish reason "cancelled"; a server's client that left). Every decoder gives
    plain decoding's tokens (greedy) or distribution (sampling). `stats.decoder` says which
    decoder ran: a lossless "ss" whose best tree here is empty decodes plainly.
    """
    opts = Options(**options).validate()
    if not _is_int(max_tokens) or max_tokens < 1:
        raise SpecstreamError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    sampling = sampling or SamplingParams()
    prompt_ids = _prompt_ids(loaded, prompt, chat)
    budget = min(max_tokens, loaded.context_length - len(prompt_ids))
    # before the clock: a first use may calibrate
    plan = resolve(loaded, opts, sampling, prompt_ids)
    stats = GenerationStats(len(prompt_ids), tree=plan.tree, decoder=plan.ran)
    detokenizer = loaded.tokenizer.detokenizer
    detokenizer.reset()
    start = time.perf_counter()
    steps, answer = decode(plan.decoder, prompt_ids, budget, sampling), []
    for step in steps:
        stats.forward_passes += 1
        stats.tree_nodes += step.tree_nodes
        stats.tree_nodes_kept += step.tree_nodes_kept
        kept, finish = _cut(step.tokens, loaded.eos_token_ids, budget - stats.generated_tokens)
        stats.accepted_tokens += len(kept) + (finish == "stop")
        for token in kept:
            detokenizer.add_token(token)
        stats.generated_tokens += len(kept)
        answer += kept
        stats.wall_seconds = time.perf_counter() - start
        if stats.forward_passes == 1:
            stats.prompt_seconds, stats.first_pass_tokens = stats.wall_seconds, len(kept)
        if finish is not None:
            detokenizer.finalize()
            if plan.memory is not None:
                plan.memory.add(prompt_ids, answer)
        yield GenerationChunk(detokenizer.last_segment, kept, stats, finish)
        if finish is not None:
            steps.close()
            return
    stats.wall_seconds = time.perf_counter() - start  # stopped while prefilling: no pass ran
    yield GenerationChunk("", [], stats, "cancelled")


def _cut(tokens: list[int], eos: set[int], room: int) -> tuple[list[int], str | None]:
    """The tokens a pass adds to the output: up to an EOS ("stop") or the budget ("length")."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i], "stop"
        if i + 1 == room:
            return tokens[: i + 1], "length"
    return tokens, None


def _prompt_ids(loaded: LoadedModel, prompt, chat: bool | None) -> list[int]:
    if _is_ids(prompt):
        prompt_ids = [int(t) for t in prompt]
        vocab = loaded.config.get("vocab_size")
        bad = [t for t in prompt_ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise SpecstreamError(f"token ids outside the vocabulary (0..{vocab}): {bad[:5]}")
    elif isinstance(prompt, str) or _is_messages(prompt):
        prompt_ids = encode_prompt(loaded, prompt, chat)
    else:
        raise SpecstreamError(
            "the prompt must be a string, a list of chat messages ({'role': str, 'content': "
            f"str}}) or a list of token ids, not {type(prompt).__name__}"
        )
    if not prompt_ids:
        raise SpecstreamError("the prompt is empty")
    if len(prompt_ids) >= loaded.context_length:
        raise SpecstreamError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds "
            f"{loaded.context_length}"
        )
    return prompt_ids


def _is_ids(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(_is_int(t) for t in prompt)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_messages(prompt) -> bool:
    return isinstance(prompt, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )


def generate(
    loaded: LoadedModel,
    prompt: str | list[dict] | list[int],
    *,
    max_tokens: int = 256,
    sampling: SamplingParams | None = None,
    chat: bool | None = None,
    **options,
) -> GenerationResult:
    """Run `stream_generate` to the end and return the whole text, token ids and statistics."""
    pieces, tokens, finish, stats = [], [], None, GenerationStats()
    for chunk in stream_generate(
        loaded, prompt, max_tokens=max_tokens, sampling=sampling, chat=chat, **options
    ):
        pieces.append(chunk.text)
        tokens.extend(chunk.token_ids)
        stats = chunk.stats
        finish = chunk.finish_reason
    shared = loaded.streams is not None and loaded.streams.config.mode == "shared"
    return GenerationResult(
        text="".join(pieces),
        token_ids=tokens,
        finish_reason=finish,
        stats=stats,
        decoder=stats.decoder,
        model=loaded.name,
        adapter=loaded.adapter if stats.decoder in ("ss", "ss+pld") or shared else None,
    )
