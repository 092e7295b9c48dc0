"""The decoding methods a benchmark compares, each behind one `run(prompt_ids, ...)` call that
returns the tokens and the timings of one generation.

- ar: our plain decoding (the reference for speedups);
- ss: Speculative Streaming with a stream adapter;
- pld: prompt lookup decoding through our tree verifier;
- ss+pld: greedy, the stream adapter's tree with the prompt lookup's chains grafted on;
  sampled, the lookup's chain when the context has a match, the streams' draft otherwise;
- mlx-lm: mlx-lm's own `stream_generate` on the base model (the incumbent on a Mac);
- medusa: Medusa-1 heads (`specstream train --mode medusa`) on the base model, through our tree
  verifier;
- lora: plain decoding of the next-token LoRA baseline (`specstream train --mode next-token`,
  same data and budget as a shared adapter): the quality a shared adapter must keep.

With a shared-mode adapter (the writing tools) ar, ss and pld all run the adapter's model (its
LoRA layers, its main stream attending to its streams); mlx-lm and medusa cannot run that model,
so they run the base model and their outputs are not expected to match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx.utils import tree_flatten

from ..errors import SpecstreamError
from ..generate import stream_generate
from ..models.loader import LoadedModel
from ..sampling import SamplingParams

METHODS = ("ar", "ss", "pld", "ss+pld", "mlx-lm", "medusa", "lora")
# Reported, never run: a two-model draft baseline needs a smaller model with the same tokenizer.
UNAVAILABLE = {
    "draft-model": "no smaller model with the same tokenizer is packaged (SmolLM2-135M is the "
    "smallest SmolLM2, Qwen2.5-Coder-0.5B the smallest Qwen2.5-Coder)"
}


@dataclass
class Sample:
    """One method's generation for one prompt."""

    token_ids: list[int]
    text: str
    wall_seconds: float
    prefill_seconds: float  # to the first token (prompt processing included)
    forward_passes: int
    accepted_tokens: int  # tokens the passes decided (tau = accepted / passes)
    peak_memory_mb: float
    tree: dict | None = None  # the draft tree the speculative decoders used (stats.tree)
    ran: str = ""  # the decoder that actually ran (stats.decoder; mlx-lm: "mlx-lm")

    @property
    def decode_seconds(self) -> float:
        return self.wall_seconds - self.prefill_seconds


@dataclass
class Method:
    name: str
    loaded: LoadedModel
    adapter: str | None = None  # the stream adapter it decodes with (ss, or a shared model's)
    extra_params: int = 0  # parameters it adds to the base model, LoRA excluded
    drafter: object = None  # medusa: a decoding.loop.Drafter
    tree: str = "auto"  # the speculative decoders' tree (stream_generate's tree=)
    _weights: int | None = field(default=None, init=False, repr=False)  # weights_bytes, once

    def run(self, prompt_ids: list[int], max_tokens: int, sampling: SamplingParams) -> Sample:
        mx.eval()  # nothing pending: what is active now is resident weights and caches
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        start = time.perf_counter()
        if self.name == "mlx-lm":
            sample = _mlx_lm(self.loaded, prompt_ids, max_tokens, sampling, start)
        else:
            sample = _ours(self, prompt_ids, max_tokens, sampling, start)
        working = max(mx.get_peak_memory() - before, 0)
        sample.peak_memory_mb = (self.weights_bytes() + working) / 2**20
        return sample

    def weights_bytes(self) -> int:
        """The tensors this method decodes with: its model (LoRA included), the streams it
        runs, a drafter's heads. Other models the benchmark process holds are not counted."""
        if self._weights is None:
            tensors = [v for _, v in tree_flatten(self.loaded.model.parameters())]
            streams = self.loaded.streams
            if streams is not None and (self.name in ("ss", "ss+pld") or self.adapter):
                tensors += [v for _, v in tree_flatten(streams.parameters())]
            if self.drafter is not None:
                tensors += [v for _, v in tree_flatten(self.drafter.heads.parameters())]
            self._weights = sum(v.nbytes for v in tensors)
        return self._weights


def _ours(method: Method, prompt_ids, max_tokens, sampling, start) -> Sample:
    tokens, pieces, stats = [], [], None
    # medusa: its drafter's trees verified; lora: its model decoded plainly
    decoder = {"medusa": "pld", "lora": "ar"}.get(method.name, method.name)
    for chunk in stream_generate(
        method.loaded,
        prompt_ids,
        max_tokens=max_tokens,
        sampling=sampling,
        decoder=decoder,
        streams=method.loaded.streams if decoder in ("ss", "ss+pld") else None,
        drafter=method.drafter,
        tree=method.tree,
    ):
        tokens += chunk.token_ids
        pieces.append(chunk.text)
        stats = chunk.stats
    return Sample(
        tokens,
        "".join(pieces),
        time.perf_counter() - start,
        stats.prompt_seconds,
        stats.forward_passes,
        stats.accepted_tokens,
        0.0,
        stats.tree,
        stats.decoder,
    )


def _mlx_lm(loaded, prompt_ids, max_tokens, sampling, start) -> Sample:
    from mlx_lm import stream_generate as mlx_lm_stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(temp=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
    if sampling.seed is not None:
        mx.random.seed(sampling.seed)
    tokens, pieces, first, stopped = [], [], None, False
    for response in mlx_lm_stream_generate(
        loaded.model, loaded.tokenizer, prompt_ids, max_tokens=max_tokens, sampler=sampler
    ):
        if first is None:
            first = time.perf_counter() - start
        pieces.append(response.text)
        if response.finish_reason == "stop":  # its token is the EOS: decided, not output
            stopped = True
            break
        tokens.append(response.token)
    n = len(tokens) + stopped  # one token per pass
    wall = time.perf_counter() - start
    return Sample(tokens, "".join(pieces), wall, first or 0.0, n, n, 0.0, None, "mlx-lm")


def stream_parameter_count(loaded: LoadedModel) -> int:
    """Parameters of the loaded stream adapter besides LoRA (the streams' own)."""
    if loaded.streams is None:
        return 0
    return sum(v.size for _, v in tree_flatten(loaded.streams.parameters()))


def check_methods(names: list[str], medusa: str | None = None, lora: str | None = None) -> None:
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SpecstreamError(f"unknown method {', '.join(unknown)}; methods: {', '.join(METHODS)}")
    if "medusa" in names and medusa is None:
        raise SpecstreamError(
            "medusa needs trained heads: --medusa DIR (specstream train --mode medusa ...)"
        )
    if "lora" in names and lora is None:
        raise SpecstreamError(
            "lora needs a next-token LoRA adapter: --lora DIR (specstream train --mode next-token)"
        )
    if "ar" not in names:
        raise SpecstreamError("the methods must include ar: speedups are measured against it")
    if len(set(names)) != len(names):
        raise SpecstreamError(f"a method is listed twice: {', '.join(names)}")


def make_methods(
    names: list[str],
    loaded: LoadedModel,
    base: LoadedModel,
    medusa: str | None = None,
    lora: str | None = None,
) -> list[Method]:
    """`loaded` carries the benchmarked adapter; `base` is the model without it (mlx-lm,
    medusa); `medusa` is a folder of trained heads, `lora` a next-token LoRA adapter folder."""
    check_methods(names, medusa, lora)
    shared = loaded.streams is not None and loaded.streams.config.mode == "shared"
    methods = []
    for name in names:
        if name in ("ss", "ss+pld"):
            methods.append(Method(name, loaded, loaded.adapter, stream_parameter_count(loaded)))
        elif name == "mlx-lm":
            methods.append(Method(name, base))
        elif name == "medusa":
            from ..baselines.medusa import MedusaDrafter, load_medusa
            from ..models.arch import arch_of

            heads = load_medusa(medusa, base, arch_of(base.model, base.config["model_type"]))
            count = sum(v.size for _, v in tree_flatten(heads.parameters()))
            methods.append(Method(name, base, medusa, count, MedusaDrafter(heads)))
        elif name == "lora":
            from .. import load

            tuned = load(base.name, adapter=lora, precision=base.precision)
            if tuned.streams is not None:  # it would decode as its own streams' model
                raise SpecstreamError(
                    f"--lora {lora} is a stream adapter, not a next-token LoRA (specstream train "
                    "--mode next-token): bench it with --adapter"
                )
            methods.append(Method(name, tuned, lora))
        else:  # ar and pld decode the adapter's model when it is a shared one
            methods.append(Method(name, loaded, loaded.adapter if shared else None))
    return methods
