"""Which decoder runs: each named decoder is a row of a table (what drafts), resolved once per
generation against the model, its active adapter and this device's calibration into a
decoding.loop.Decoder, and reported as what actually runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import mlx.core as mx

from .backend import device_name
from .calibration import latency_curve, tuned
from .decoding.lookup import (
    GRAFT,
    LookupConfig,
    LookupCosts,
    LookupMemory,
    LookupRates,
    lookup_drafter,
    lookup_grafter,
)
from .decoding.loop import Decoder, Drafter, DraftOverride
from .decoding.passes import Passes
from .decoding.policy import TreePolicy
from .errors import SpecstreamError
from .models.arch import SUPPORTED, arch_of
from .sampling import SamplingParams
from .streams.config import StreamConfig
from .streams.params import StreamParams


@dataclass(frozen=True)
class Row:
    streams: bool  # the streams draft
    lookup: bool  # prompt lookup drafts when the context has a match


# decoder name -> what drafts. The streams of an adapter whose main stream attends to them (shared
# mode, main_reads_streams) run under every decoder; they draft only where the row says so.
DECODERS = {
    "ar": Row(streams=False, lookup=False),
    "ss": Row(streams=True, lookup=False),
    "pld": Row(streams=False, lookup=True),
    "ss+pld": Row(streams=True, lookup=True),
}
TREE_CHOICES = ("auto", "adapter")


@dataclass
class Options:
    """How to decode, as `stream_generate` was asked."""

    decoder: str = "ar"
    streams: StreamParams | None = None  # default: the loaded model's (or untrained ones)
    tree: str = "auto"  # "auto": the tree calibrated for this device; "adapter": the streams'
    compile: bool | None = None  # None: as this device's calibration measured faster
    kv_bits: int | None = None
    drafter: Drafter | None = None  # drafts from elsewhere (Medusa heads) for "pld"
    draft_override: DraftOverride | None = None  # test hook: the streams' proposals
    stop: Callable[[], bool] | None = None  # asked while prefilling: True ends the generation

    def validate(self) -> Options:
        if self.tree not in TREE_CHOICES:
            raise SpecstreamError(
                f"tree must be one of {', '.join(TREE_CHOICES)}, got {self.tree!r}"
            )
        if self.decoder not in DECODERS:
            raise SpecstreamError(
                f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}"
            )
        if self.kv_bits not in (None, 4, 8):
            raise SpecstreamError(f"kv_bits must be 4 or 8 (or None), got {self.kv_bits}")
        return self


@dataclass
class Resolved:
    decoder: Decoder
    ran: str  # the decoder that actually runs (a lossless "ss" whose best tree is empty: "ar")
    tree: dict | None  # the draft tree and where it came from (speculative decoders)
    memory: LookupMemory | None = None  # the lookup's earlier answers: this one's joins them


def resolve(loaded, opts: Options, sampling: SamplingParams, prompt: list[int] = ()) -> Resolved:
    """The Decoder for one generation from `prompt` with `loaded` (and the adapter on it)."""
    row = DECODERS[opts.decoder]
    main_reads = loaded.streams is not None and loaded.streams.config.main_needs_streams
    streams = loaded.streams if main_reads else None
    policy, tree, ran = TreePolicy(), None, opts.decoder
    if row.streams:
        streams = opts.streams or default_streams(loaded)
        policy, tree = _policy(loaded, streams, opts, sampling)
        if policy.depth == 0:  # no tree beats one token per pass here: nothing is drafted
            ran = "pld" if row.lookup else "ar"
            if not main_reads:  # streams the main stream ignores would only cost time
                streams = None
    drafter = opts.drafter
    if drafter is not None and main_reads:
        raise SpecstreamError(
            "a drafter verifies on the model alone, not with an adapter whose main stream reads "
            "its streams"
        )
    supported = loaded.config["model_type"] in SUPPORTED
    if not supported and (row.streams or row.lookup or drafter is not None or main_reads):
        arch_of(loaded.model, loaded.config["model_type"])  # raises the clear error
    arch = arch_of(loaded.model, loaded.config["model_type"]) if supported else None
    compiled = _compile_default(loaded) if opts.compile is None else opts.compile
    passes = (
        passes_for(loaded, arch, streams, compiled) if supported and opts.drafter is None else None
    )
    dec = Decoder(loaded.model, arch, streams, policy, drafter, passes, opts.kv_bits)
    dec.override, dec.stop = opts.draft_override, opts.stop
    if drafter is None and row.lookup:
        memory = lookup_memory(loaded)
        recalled = memory.recall(prompt)
        dec, tree = _with_lookup(loaded, dec, tree, sampling, recalled)
        return Resolved(dec, ran, {**tree, "recalled_tokens": len(recalled)}, memory)
    return Resolved(dec, ran, tree)


def _with_lookup(
    loaded, dec: Decoder, tree: dict | None, sampling, recalled
) -> tuple[Decoder, dict]:
    """Prompt lookup added to `dec`: grafted onto the streams' tree where they draft one that
    is never cut (the early-exit head would prune grafted nodes like the streams' own),
    decoding is greedy and their rows may ride along on every node (a main stream that reads
    them, or lossless streams the curve finds cheap enough: `_chains_run_streams`); else
    drafted instead of their tree whenever the context has a match (or the `recalled` earlier
    answers: LookupMemory.recall)."""
    lookup = LookupConfig()
    dec.chain_streams = _chains_run_streams(loaded, dec, tree, lookup)
    graftable = dec.streams is not None and dec.policy.depth > 0 and not dec.policy.may_cut()
    if graftable and sampling.greedy and dec.chain_streams:
        nodes = dec.policy.max_nodes + 2 * max(GRAFT.max_draft, GRAFT.recall_draft)
        costs = _lookup_costs(loaded, dec, tree, GRAFT, nodes)
        rates = lookup_rates(loaded, dec.streams)
        dec = replace(dec, graft=lookup_grafter(GRAFT, costs, rates, recalled))
        gated = costs is not None
        return dec, {**tree, "lookup": "grafted", "lookup_gated": gated, "chain_streams": True}
    costs = _lookup_costs(loaded, dec, tree, lookup)
    dec = replace(dec, drafter=lookup_drafter(lookup, costs, recalled))
    tree = {**(tree or {"source": "lookup"}), "lookup": "chains", "lookup_gated": costs is not None}
    if dec.streams is not None and dec.policy.depth > 0:
        tree["chain_streams"] = dec.chain_streams
    return dec, tree


def lookup_rates(loaded, streams: StreamParams) -> LookupRates:
    """The grafting lookup gate's evidence for `streams` on `loaded`, kept from one generation
    to the next (a writing tool's answer is too short to learn a chain kind's rate in)."""
    kept = loaded.lookup_rates.get(id(streams))
    if kept is None or kept[0] is not streams:
        kept = loaded.lookup_rates[id(streams)] = (streams, LookupRates())
    return kept[1]


def lookup_memory(loaded) -> LookupMemory:
    """The earlier answers the lookup drafts from on `loaded` with its active adapter, kept
    from one generation to the next."""
    return loaded.lookup_memory.setdefault(loaded.adapter, LookupMemory())


def default_streams(loaded, config=None) -> StreamParams:
    """Untrained streams for `loaded`, made once and kept on it."""
    if loaded.streams is None:
        config = (config or StreamConfig()).validate(loaded.config["num_hidden_layers"])
        loaded.streams = StreamParams(config, loaded.config["hidden_size"])
        mx.eval(loaded.streams.parameters())
    return loaded.streams


def passes_for(loaded, arch, streams: StreamParams | None, compiled: bool) -> Passes:
    """The passes of `loaded` with `streams`, kept on `loaded` so traces outlive a generation."""
    key = (id(streams), compiled)
    passes = loaded.passes.get(key)
    if passes is None or passes.params is not streams or passes.arch.embed is not arch.embed:
        passes = loaded.passes[key] = Passes(arch, streams, compiled)
    return passes


def _policy(loaded, streams: StreamParams, opts: Options, sampling) -> tuple[TreePolicy, dict]:
    """The tree the streams draft: calibrated for the device when they carry acceptance
    statistics (tree="auto"), their own otherwise. The statistics are greedy, so a sampled
    generation drafts the streams' own tree, or nothing where no greedy tree pays: sampling
    accepts fewer drafts than greedy decoding (`chat` with its own tree ran 0.93x `ar` at T 0.7)."""
    if opts.tree == "auto" and opts.draft_override is None:
        plan = tuned(loaded, streams)
        if plan is not None and (sampling.greedy or not plan.paths):
            return plan.policy(), {"source": "calibrated", **plan.to_dict()}
    policy = TreePolicy.of(streams.config)
    return policy, {
        "source": "adapter",
        "top_k": policy.top_k,
        "max_tree_nodes": policy.max_nodes,
        "prune_threshold": policy.prune_threshold,
        "depth": policy.depth,
    }


def _lookup_costs(
    loaded, dec: Decoder, tree: dict | None, lookup: LookupConfig, nodes: int = 0
) -> LookupCosts | None:
    """What a chain of `lookup` drafts (or a pass of up to `nodes` nodes, when more) costs on
    this device and what runs instead, from the latency curve: the streams' calibrated tree
    (`tree`), or a pass of the root alone (also where the streams draft their own tree: it
    carries no expected tokens to weigh). None before this device was measured for `loaded`:
    whole chains are drafted then."""
    curve = latency_curve(loaded, measure=False)
    if curve is None:
        return None
    drafted = dec.drafted if dec.policy.depth > 0 else 0  # stream heads, for the next pass
    vocab = loaded.config["vocab_size"]

    def ms(nodes: int) -> float:  # a chain pass: the streams ride along or sit it out
        if dec.streams is None:
            return curve.pass_ms(nodes, 0, 0, 0)
        streams, heads = (dec.n_streams, drafted) if nodes == 1 or dec.chain_streams else (0, 0)
        return curve.streams_pass_ms(dec.streams.config, vocab, nodes, streams, heads)

    longest = max(lookup.max_draft, lookup.recall_draft)
    chain = tuple(ms(1 + n) for n in range(max(longest + 1, nodes)))
    if dec.policy.depth > 0 and tree and "expected_tokens_per_pass" in tree:
        tokens, tree_ms = tree["expected_tokens_per_pass"], tree["predicted_pass_ms"]
        gated = tuple(tree.get("gates", ())), tuple(tree.get("bin_expected_tokens", ()))
        cfg = dec.streams.config  # lossless streams may sit a chain's pass out
        bare = [curve.streams_pass_ms(cfg, vocab, 1 + n, 0, 0) for n in range(len(chain))]
        bare = () if cfg.main_needs_streams else tuple(bare)
        return LookupCosts(chain, tokens, tree_ms, *gated, bare)
    return LookupCosts(chain)


def _chains_run_streams(loaded, dec: Decoder, tree: dict | None, lookup: LookupConfig) -> bool:
    """Whether a pass verifying a lookup chain runs the streams too, so that the next pass can
    draft their tree. Shared mode: always (the main stream attends to them). Lossless streams
    sit chain passes out where the latency curve says their rows cost a chain pass more than
    they give the pass after it: where no chain follows, that pass runs the root alone
    (streams included, for the pass after) instead of the streams' calibrated tree, and loses
    its ms a token less the tree's."""
    streams = dec.streams
    if streams is None or dec.policy.depth == 0 or streams.config.main_needs_streams:
        return True
    curve = latency_curve(loaded, measure=False)
    if curve is None or not tree or "expected_tokens_per_pass" not in tree:
        return True
    cfg, chain, vocab = streams.config, 1 + lookup.max_draft, loaded.config["vocab_size"]

    def ms(nodes: int, streams: int) -> float:
        return curve.streams_pass_ms(cfg, vocab, nodes, streams, min(streams, dec.drafted))

    saved = ms(chain, dec.n_streams) - ms(chain, 0)
    lost = ms(1, dec.n_streams) - tree["predicted_pass_ms"] / tree["expected_tokens_per_pass"]
    return saved <= lost


def _compile_default(loaded) -> bool:
    curve = latency_curve(loaded, measure=False)  # kept on `loaded` once read
    if curve is not None:
        return curve.compiled
    return not device_name().startswith("cpu")
