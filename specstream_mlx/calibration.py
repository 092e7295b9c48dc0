"""Hardware calibration: how long a forward pass takes on this device for R rows in flight, and
the tree that decodes fastest here given an adapter's measured acceptance.

The latency curve is measured once per device, model, precision, MLX version and BLAS, and kept
in a small JSON file under SPECSTREAM_CACHE/calibration. A tree pass is predicted from it: the N
nodes through the layers below the MSA layers, N nodes plus their streams through the MSA layers,
the LM head over the rows it projects, plus a measured fixed cost per pass (graph building, the
wait for the result, KV compaction).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from .backend import device_name, preload_blas
from .decoding.loop import Decoder, Prefill, decode, decode_from, make_cache
from .decoding.passes import Passes, compilable
from .decoding.plan import MIN_GAIN, Acceptance, TreePlan, choose_tree, choose_walked
from .decoding.policy import TreePolicy
from .decoding.tree import Tree
from .decoding.tree_step import ONE_HEAD_PASS_ROWS
from .errors import SpecstreamError
from .models.arch import arch_of
from .models.loader import LoadedModel, cache_dir
from .streams.config import StreamConfig
from .streams.params import StreamParams

# 5: loop costs of the one decoding loop (passes settled on the device, pipelined)
# 6: loops timed over every round, the plain step capped by the bare one-row pass
# 7: loops timed at a second MSA depth (msa_deep): what stream rows cost a layer beyond the curve
# 8: what a pass of a tree per confidence bin costs beyond a static tree's (gated_ms)
CURVE_VERSION = 8
CURVE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
LOOP_NODES = (1, 2, 3, 4, 6, 8, 12, 16)  # tree sizes timed in a real decoding loop
# The MSA depths the loops are timed at (each at most the model's layers less one): a shallow
# one and the deepest shipped adapter's (`chat`, 16); a pass at another depth is interpolated.
MSA_REF, MSA_DEEP = 4, 16
DEEP_NODES = 8  # the largest tree timed at MSA_DEEP too (a larger one: along the curve)
# Row counts whose forward pass costs more than this many 1-row passes are not timed (no tree
# that large can pay, and on a device where cost grows with rows, e.g. quantized weights on a
# CPU, timing them would take many minutes); the curve extends proportionally past them.
MAX_COST_RATIO = 6.0
# A one-row pass timed at the start of a measurement and again a stage later may differ by this
# much (relative) before the curve is deemed measured on a busy machine and is not cached: one
# measured while training ran here said 112 ms per plain step against 43 ms idle (2026-11-26).
MAX_DRIFT = 0.5
# Other programs' share of the machine's CPU time while a CPU-device curve was measured (niced
# ones too) above which it is not cached either: a steady load moves nothing between stages,
# yet times every pass 2x slow and the rows' costs out of proportion (a curve cached under
# training on 2026-11-26: plain step 123.7 ms, head 30.1; idle 69.0, 9.5). A niced program does
# not yield the cores to MLX's CPU backend: 16 compiled MSA layers took 304-630 ms beside a
# `nice -n 19` torch training run against 39-50 ms without it (2026-12-01; docs/BENCHMARKS.md).
MAX_OTHERS_CPU = 0.25


@dataclass
class LatencyCurve:
    device: str
    model: str
    precision: str
    key: str
    n_layers: int
    context: int  # tokens in the KV cache while measuring
    rows: list[int]
    layer_ms: list[float]  # one decoder layer, R rows in flight
    head_ms: list[float]  # final norm + LM head over R rows
    plain_step_ms: float = 0.0  # a step of the plain decoding loop (pipelined), measured
    loop_ms: list = field(default_factory=list)  # a pass of loop_nodes nodes, 1 stream each
    loop_nodes: list = field(default_factory=list)  # the LOOP_NODES timed (see MAX_COST_RATIO)
    msa_ref: int = 4  # MSA layers of the streams loop_ms was measured with
    # The same loops with the streams in `msa_deep` MSA layers (none where the model has too few
    # layers): stream rows cost more a layer in the loop than the bare layer curve says (2-node
    # pass in 16 layers vs 4: +7 to +27 ms measured, +4.6 predicted; docs/BENCHMARKS.md)
    msa_deep: int = 0
    loop_deep_ms: list = field(default_factory=list)
    # What a pass costs more when the next pass's tree depends on this one's confidence (a tree
    # per bin: the next pass is built only once this one is read back, not while it runs), a
    # 2-node loop's pass against the same static one's; 0 where not measured.
    gated_ms: float = 0.0
    compiled: bool = False  # compiled passes (decoding.passes) measured faster here
    mode_ms: dict = field(default_factory=dict)  # eager vs compiled pass ms at 1, 2, 4 rows
    measured_seconds: float = 0.0
    drift: float = 0.0  # the one-row pass's relative change between two stages (a busy machine)
    others_cpu: float | None = None  # other programs' share of the CPUs meanwhile (None: unknown)
    version: int = CURVE_VERSION

    @property
    def steady(self) -> bool:
        """Measured on a machine whose load did not change meanwhile and that no other program
        kept busy: worth caching."""
        return self.drift <= MAX_DRIFT and (self.others_cpu or 0.0) <= MAX_OTHERS_CPU

    def _at(self, values: list[float], r: float) -> float:
        return (
            float(np.interp(r, self.rows, values))
            if r <= self.rows[-1]
            else (
                values[-1] * r / self.rows[-1]  # beyond the grid: proportional to rows
            )
        )

    def layer(self, rows: float) -> float:
        return self._at(self.layer_ms, rows)

    def head(self, rows: float) -> float:
        return self._at(self.head_ms, rows)

    @property
    def plain_ms(self) -> float:
        """One plain decoding step: as measured in the decoding loop, or every layer and the
        head on one row."""
        return self.plain_step_ms or self.n_layers * self.layer(1) + self.head(1)

    def _layers_and_head(self, nodes: int, streams: int, n_msa: int, drafted: int) -> float:
        """`nodes` rows below the MSA layers, each with `streams` stream rows in them; the head
        on the nodes and on their first `drafted` streams (decoding.passes)."""
        msa_rows, head_rows = nodes * (1 + streams), nodes * (1 + drafted)
        head = (
            self.head(head_rows)
            if drafted and head_rows <= ONE_HEAD_PASS_ROWS
            else self.head(nodes) + (self.head(drafted) if drafted else 0.0)
        )
        return (self.n_layers - n_msa) * self.layer(nodes) + n_msa * self.layer(msa_rows) + head

    def shared_plain_ms(self, streams: int, n_msa: int) -> float:
        """A plain decoding step of a shared-mode adapter: the plain step plus its `streams`
        stream rows in the top `n_msa` layers (the main stream attends to them; no head runs on
        them: nothing is drafted), as the bare curve prices them plus what the loops measured
        stream rows to cost a layer beyond it."""
        rows = n_msa * (self.layer(1 + streams) - self.layer(1))
        return self.plain_ms + rows + (n_msa * self._stream_excess(1) if streams else 0.0)

    def pass_ms(self, nodes: int, streams: int, n_msa: int, drafted: int | None = None) -> float:
        """A tree pass in the decoding loop: `nodes` nodes, each with `streams` streams in the top
        `n_msa` layers. The measured loop pass of that size (one stream per node in `msa_ref`
        layers), moved by the curve to other stream counts and depths, plus what stream rows
        were measured to cost a layer beyond the curve (the loops at `msa_deep`); beyond the
        largest measured size, extended along the curve. The head runs on the first `drafted`
        streams (default all) of every node."""
        drafted = streams if drafted is None else drafted
        size = min(nodes, self.loop_nodes[-1])
        loop = float(np.interp(size, self.loop_nodes, self.loop_ms))
        measured_shape = self._layers_and_head(size, 1, self.msa_ref, 1)
        moved = loop + self._layers_and_head(nodes, streams, n_msa, drafted) - measured_shape
        excess = (n_msa - self.msa_ref) * self._stream_excess(size) if streams else 0.0
        return moved + excess

    def streams_pass_ms(
        self, cfg: StreamConfig, vocab: int, nodes: int, streams: int, drafted: int
    ) -> float:
        """`pass_ms` for streams of `cfg` (of a model with `vocab` tokens) whose next draft reads
        `drafted` streams' logits, their head passes as `cfg` runs them: with the main rows'
        (`one_head_pass`); with parent heads, one row per drafted stream, one after the other
        (tree_step.stream_logits); over a draft vocabulary of K tokens, K / V of the head's
        time (a head pass is memory-bound: benchmarks/draft_head.py measures the share). Streams
        that know the next token add the early-exit head on the nodes."""
        guess = self.head(nodes) if cfg.next_token_guess else 0.0
        if not (cfg.parent_rank or cfg.draft_vocab):
            return self.pass_ms(nodes, streams, cfg.n_msa_layers, drafted) + guess
        share = len(cfg.draft_vocab) / vocab if cfg.draft_vocab else 1.0
        heads = drafted * self.head(1) if cfg.parent_rank else self.head(drafted) if drafted else 0
        return self.pass_ms(nodes, streams, cfg.n_msa_layers, 0) + share * heads + guess

    def _stream_excess(self, size: float) -> float:
        """ms a layer of stream rows (one per node of a `size`-node pass) costs in the loop
        beyond what the bare layer curve says: the slope between the loops at `msa_ref` and at
        `msa_deep` layers less the curve's (0 without both; past the largest size timed deep,
        that size's)."""
        deep = self.loop_deep_ms
        if len(deep) < 2 or self.msa_deep <= self.msa_ref:
            return 0.0
        nodes, layers = self.loop_nodes[: len(deep)], self.msa_deep - self.msa_ref
        excess = [
            (d - r - self._layers_and_head(n, 1, self.msa_deep, 1)
             + self._layers_and_head(n, 1, self.msa_ref, 1)) / layers
            for n, d, r in zip(nodes, deep, self.loop_ms, strict=False)
        ]  # fmt: skip
        return float(np.interp(size, nodes, excess))

    def to_dict(self) -> dict:
        return asdict(self)


@functools.cache
def machine_id() -> str:
    """The chip: Metal's device name, or the CPU's model name and core count."""
    if mx.default_device() != mx.cpu and mx.metal.is_available():
        try:
            return str(mx.metal.device_info().get("device_name", "metal"))
        except Exception:  # the call moved between MLX versions
            return "metal"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{os.cpu_count()}"


def curve_key(loaded: LoadedModel) -> str:
    """What the curve depends on: device and chip, model (name and shape) and the LoRA layers on
    it (a shared-mode adapter's cost more), precision, MLX, BLAS."""
    from .streams.adapter_io import base_fingerprint
    from .streams.lora import current_lora

    parts = {
        "device": device_name(),
        "machine": machine_id(),
        "lora": current_lora(loaded.model),
        "model": loaded.name,
        "fingerprint": base_fingerprint(loaded),
        "precision": loaded.precision,
        "mlx": mx.__version__,
        "blas": preload_blas().library if mx.default_device() == mx.cpu else None,
        "version": CURVE_VERSION,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def curve_path(loaded: LoadedModel) -> Path:
    return cache_dir() / "calibration" / f"{curve_key(loaded)}.json"


def _affordable(rows, make_run) -> list[int]:
    """The leading row counts whose single timed pass (after a warm-up one) costs at most
    MAX_COST_RATIO times the first one's; at least two."""
    kept, first = [], None
    for r in rows:
        run = make_run(r)
        run()
        start = time.perf_counter()
        run()
        ms = (time.perf_counter() - start) * 1000
        first = ms if first is None else first
        if len(kept) >= 2 and ms > MAX_COST_RATIO * first:
            break
        kept.append(r)
    return kept


def _interleaved_ms(fns: dict, rounds: int) -> dict:
    """Median milliseconds of each function, run in turn for `rounds` rounds after one warm-up
    round: drifts of a shared machine hit every function alike."""
    times: dict = {name: [] for name in fns}
    for round_ in range(rounds + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_:
                times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


CURVE_STAGES = ("compiled or eager", "row counts", "LM head", "decoding loops")


def measure_curve(
    loaded: LoadedModel, rounds: int = 5, context: int = 128, rows=CURVE_ROWS, on_stage=None
) -> LatencyCurve:
    """Time the model's passes and head for each row count, with `context` tokens cached: first
    whether compiled passes beat eager ones here, then every row count in the faster mode.
    `on_stage(i)` is told when stage CURVE_STAGES[i] starts (a progress display)."""
    started = time.perf_counter()
    others = others_cpu_share() if mx.default_device() == mx.cpu else (lambda: None)
    stage = on_stage or (lambda i: None)
    model, config = loaded.model, loaded.config
    arch = arch_of(model, config["model_type"])
    n_layers = len(arch.layers)
    context = max(1, min(context, loaded.context_length - 2 * max(rows) - 2))
    cache = make_cache(model)
    vocab = config["vocab_size"]
    mx.eval(model(mx.arange(context)[None] % vocab, cache=cache)[0, -1])
    passes = Passes(arch, None, compiled=True)

    def chain(r):
        return Tree(list(range(7, 7 + r)), list(range(-1, r - 1)), list(range(r)))

    def forward(r: int, compiled: bool):
        tree, tokens = chain(r), (mx.arange(r)[None] + 7) % vocab

        def run():
            if compiled:
                mx.eval(passes.logits(tree, cache)[0])
            else:
                mx.eval(model(tokens, cache=cache))
            for c in cache:
                c.trim(r)

        return run

    can_compile = compilable(cache)
    modes = {}
    stage(0)
    if can_compile:
        probe = {(c, r): forward(r, c) for r in (1, 2, 4) for c in (False, True)}
        modes = _interleaved_ms(probe, rounds + 2)
    compiled = can_compile and sum(modes[(True, r)] for r in (1, 2, 4)) < sum(
        modes[(False, r)] for r in (1, 2, 4)
    )
    stage(1)
    rows = _affordable(rows, lambda r: forward(r, compiled))
    timed = _interleaved_ms({r: forward(r, compiled) for r in rows}, rounds)
    stage(2)
    heads = {}
    for r in rows:
        h = mx.random.normal((1, r, arch.dims)).astype(arch.norm.weight.dtype)
        mx.eval(h)
        heads[r] = lambda h=h: mx.eval(arch.lm_head(arch.norm(h)))
    head_ms = _interleaved_ms(heads, rounds)
    # More rows never cost less: smooth the measurement noise away.
    head = np.maximum.accumulate([head_ms[r] for r in rows])
    total = np.maximum.accumulate([timed[r] for r in rows])
    layer = np.maximum.accumulate(np.maximum(total - head, 0.0) / n_layers)
    curve = LatencyCurve(
        device_name(),
        loaded.name,
        loaded.precision,
        curve_key(loaded),
        n_layers,
        context,
        list(rows),
        [round(float(v), 4) for v in layer],
        [round(float(v), 4) for v in head],
        compiled=bool(compiled),
        msa_ref=max(1, min(MSA_REF, n_layers - 1)),
        mode_ms={f"{'compiled' if c else 'eager'}_{r}": round(v, 2) for (c, r), v in modes.items()},
    )
    stage(3)
    _measure_loops(loaded, arch, curve, context, rounds)
    # Plain decoding overlaps building the next step with this one, so a step never costs more
    # than the bare one-row pass; a median above it is noise of the shared machine (measured
    # 58.7 ms against 54.8, which made trees that lose look 10% faster).
    if rows[0] == 1:
        curve.plain_step_ms = min(curve.plain_step_ms, round(timed[1], 3))
        first = modes.get((compiled, 1))  # the same pass, timed in the first stage
        if first:
            curve.drift = round(abs(timed[1] / first - 1), 3)
    curve.measured_seconds = round(time.perf_counter() - started, 2)
    curve.others_cpu = others()
    return curve


def others_cpu_share():
    """A function giving, since this call, the share of the machine's CPU time that other
    programs used (Linux's /proc/stat less this process's own time; niced programs included),
    or None where the system does not say."""

    def sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        busy, total = user + nice + system + irq + softirq + steal, sum(fields)
        mine = os.times()
        return busy, total, mine.user + mine.system

    start = sample()

    def share() -> float | None:
        end = sample()
        if start is None or end is None or end[1] <= start[1]:
            return None
        hz = os.sysconf("SC_CLK_TCK")
        others = (end[0] - start[0]) / hz - (end[2] - start[2])
        return round(max(0.0, others / ((end[1] - start[1]) / hz)), 3)

    return share


def _measure_loops(loaded, arch, curve: LatencyCurve, context: int, rounds: int) -> None:
    """Real decoding loops (decoding.loop), in the curve's mode, interleaved: plain decoding
    sets `plain_step_ms`; Speculative Streaming with untrained streams on a static tree of N
    nodes (the root and N - 1 children: one stream per node) in `msa_ref` MSA layers sets
    `loop_ms[N]`, in MSA_DEEP ones (where the model has more; N up to DEEP_NODES)
    `loop_deep_ms[N]`: everything a pass costs, reading it back and compacting the cache
    included; the 2-node tree drafted as a tree per confidence bin sets `gated_ms`."""
    vocab, steps = loaded.config["vocab_size"], 10
    deep = min(MSA_DEEP, curve.n_layers - 1)
    depths = [curve.msa_ref] + ([deep] if deep > curve.msa_ref else [])
    plain = Decoder(loaded.model, arch, passes=Passes(arch, None, curve.compiled))
    start = Prefill(plain, [int(t) for t in (np.arange(context) * 7 + 3) % vocab])

    def per_step(dec: Decoder):
        return lambda: loop_ms(dec, start, steps)

    fns = {0: per_step(plain)}
    nodes = [n for n in LOOP_NODES if n <= curve.rows[-1]]
    for d in depths:
        sizes = nodes if d == curve.msa_ref else [n for n in nodes if n <= DEEP_NODES]
        for n in sizes:
            fns[(d, n)] = per_step(star_decoder(loaded, arch, n, d, curve.compiled))
            if (d, n) == (curve.msa_ref, 2):  # timed next to its static partner
                fns["gated"] = per_step(gated_decoder(loaded, arch, d, curve.compiled))
    for fn in fns.values():  # warm-up: traces, allocations
        fn()
    times: dict = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            times[key].append(fn())
    curve.plain_step_ms = round(statistics.median(times[0]), 3)
    if "gated" in times:  # paired within rounds: the machine's speed moves between them
        extra = [g - s for g, s in zip(times["gated"], times[(curve.msa_ref, 2)], strict=True)]
        curve.gated_ms = round(max(0.0, statistics.median(extra)), 3)
    # more nodes, and the same nodes in more layers, never cost less: noise smoothed away
    floor = np.zeros(len(nodes))
    for d in depths:
        timed = [statistics.median(times[(d, n)]) for n in nodes if (d, n) in times]
        ms = np.maximum.accumulate(np.maximum(timed, floor[: len(timed)]))
        floor = ms
        if d == curve.msa_ref:
            curve.loop_ms = [round(float(v), 3) for v in ms]
        else:
            curve.msa_deep, curve.loop_deep_ms = d, [round(float(v), 3) for v in ms]
    curve.loop_nodes = nodes


def loop_ms(dec: Decoder, start: Prefill, steps: int, skip: int = 1) -> float:
    """ms per pass of decoding.loop with `dec` from `start` over `steps` passes, after `skip`
    untimed ones (the first has no draft yet)."""
    iterator = decode_from(dec, start.state(dec), 10**6)
    for _ in range(skip):
        next(iterator)
    began = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    iterator.close()
    return (time.perf_counter() - began) * 1000 / steps


def star_decoder(loaded, arch, nodes: int, n_msa_layers: int, compiled: bool) -> Decoder:
    """Untrained streams (one per node) drafting a static star: the root and N - 1 children."""
    cfg = StreamConfig(gamma=1, n_msa_layers=n_msa_layers, top_k=max(nodes - 1, 1))
    params = StreamParams(cfg, loaded.config["hidden_size"])
    mx.eval(params.parameters())
    policy = TreePolicy.static(tuple((i,) for i in range(nodes - 1)))
    return Decoder(loaded.model, arch, params, policy, passes=Passes(arch, params, compiled))


def gated_decoder(loaded, arch, n_msa_layers: int, compiled: bool) -> Decoder:
    """star_decoder's 2-node tree drafted as a tree per confidence bin (the root alone in a bin
    no confidence reaches): the same passes, each waiting for the last one's confidence."""
    star = star_decoder(loaded, arch, 2, n_msa_layers, compiled)
    return replace(star, policy=TreePolicy.gated((2.0,), (((0,),), ())))


def read_curve(loaded: LoadedModel) -> LatencyCurve | None:
    """The cached curve for this device, model and precision; None when there is none (or it is
    unreadable or from an older format: it is then measured again)."""
    path = curve_path(loaded)
    try:
        data = json.loads(path.read_text())
        curve = LatencyCurve(**data)
    except (OSError, ValueError, TypeError):
        return None
    if curve.version != CURVE_VERSION or curve.key != curve_key(loaded):
        return None
    return curve


def write_json_atomic(path: Path, data: dict) -> None:
    """Written beside `path`, then renamed over it; readable by everyone (as an ordinary file
    would be: mkstemp makes it private)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_curve(loaded: LoadedModel, curve: LatencyCurve) -> bool:
    """Write `curve` to the cache (OSError if it cannot). One measured while the machine was busy
    (its load changed, or other programs kept the CPUs busy) is cached as provisional, with a
    warning: later runs use it rather than spend another minute measuring a busy machine, and
    the first one that finds the machine idle measures again (`latency_curve`). Returns whether
    it was steady."""
    if not curve.steady:
        why = (
            f"the device's speed changed by {curve.drift:.0%} while measuring it (another "
            "program busy?)"
            if curve.drift > MAX_DRIFT
            else f"other programs used {curve.others_cpu:.0%} of the CPUs while measuring it"
        )
        print(
            f"specstream: {why}; the latency curve is used and kept as provisional until a run "
            "finds this machine idle (or run `specstream calibrate --force` on an idle machine)",
            file=sys.stderr,
            flush=True,
        )
    write_json_atomic(curve_path(loaded), curve.to_dict())
    return curve.steady


def machine_idle(seconds: float = 0.3) -> bool:
    """Whether other programs left the CPUs idle over the next `seconds` (their share at most
    MAX_OTHERS_CPU). Devices other than the CPU, and systems that do not say, count as idle."""
    if mx.default_device() != mx.cpu:
        return True
    share = others_cpu_share()
    time.sleep(seconds)
    used = share()
    return used is None or used <= MAX_OTHERS_CPU


def latency_curve(loaded: LoadedModel, measure: bool = True) -> LatencyCurve | None:
    """This device's curve for `loaded`: kept on it, read from the cache, or measured now
    (minutes on a CPU) and cached. measure=False returns None instead of measuring."""
    curve = loaded.latency_curve
    if curve is not None and curve.key == curve_key(loaded):
        return curve
    curve = read_curve(loaded)
    if curve is not None and not curve.steady:
        if not measure:  # not kept: the run's first call that may measure checks for idleness
            return curve
        if machine_idle():
            curve = None  # measured on a busy machine: measure again now that it is idle
    if curve is None:
        if not measure:
            return None
        print(  # silent minutes would look like a hang, in a pipe too
            f"specstream: measuring this device once for {loaded.name} (minutes on a CPU; "
            "`specstream calibrate` does it ahead)",
            file=sys.stderr,
            flush=True,
        )
        curve = measure_curve(loaded)
        try:
            cache_curve(loaded, curve)
        except OSError:
            pass  # a read-only cache: measured again next time
    loaded.latency_curve = curve
    return curve


def plan_tree(loaded: LoadedModel, params: StreamParams, curve: LatencyCurve) -> TreePlan | None:
    """The fastest static tree for `params` on this device, from its acceptance statistics;
    None when the streams carry none."""
    acceptance: Acceptance | None = getattr(params, "acceptance", None)
    if acceptance is None:
        return None
    cfg = params.config
    if acceptance.gamma != cfg.gamma:
        raise SpecstreamError(
            f"acceptance statistics are for {acceptance.gamma} streams, the adapter has {cfg.gamma}"
        )
    main_reads = cfg.main_needs_streams
    vocab = loaded.config["vocab_size"]

    def pass_ms(nodes: int, depth: int) -> float:
        # only the streams the next draft needs run, or all where the main stream attends to them
        streams = cfg.gamma if main_reads else depth
        return curve.streams_pass_ms(cfg, vocab, nodes, streams, depth)

    plain = curve.plain_ms
    if main_reads:  # the main stream attends to the streams, and they to the guess
        plain = curve.shared_plain_ms(cfg.gamma, cfg.n_msa_layers)
        plain += curve.head(1) if cfg.next_token_guess else 0.0
    if acceptance.trace is not None and acceptance.positions:
        return choose_walked(acceptance, pass_ms, plain, required_gain(curve), curve.gated_ms)
    return choose_tree(acceptance, pass_ms, plain, min_gain=required_gain(curve))


def required_gain(curve: LatencyCurve) -> float:
    """The speed over plain decoding a tree must promise before it is chosen: MIN_GAIN, or more
    when the curve's own one-row pass moved more than that while it was measured. A prediction is
    no better than the timings behind it: a curve that drifted 20% picked a tree predicted at
    1.04x that ran at 0.89x plain decoding (dialogsum, 2026-11-27)."""
    return max(MIN_GAIN, 1.0 + curve.drift)


def tuned(loaded: LoadedModel, params: StreamParams) -> TreePlan | None:
    """The tree chosen for `params` on this device (None when they carry no acceptance
    statistics); kept on `loaded` for the next call."""
    if getattr(params, "acceptance", None) is None:
        return None
    key = (id(params), curve_key(loaded))
    plan = loaded.trees.get(key)
    if plan is None:
        plan = loaded.trees[key] = plan_tree(loaded, params, latency_curve(loaded))
    return plan


def measure_acceptance(
    loaded: LoadedModel,
    params: StreamParams,
    prompts: list,
    max_tokens: int = 128,
    source: str = "",
    on_prompt=None,
) -> Acceptance:
    """Acceptance statistics of `params` measured by greedy decoding: at every decided
    position, the rank of each later token among its stream's proposals. The decode drafts
    nothing (one token a pass, the streams probed at each), so every position counts once,
    not only those after a pass's last accepted draft, which a speculative decode would
    give and which skew towards positions right after a correction. `loaded` must carry the
    adapter (shared mode: its LoRA layers).
    `on_prompt(done, total, positions)` follows the prompts (a progress display)."""
    from .decoding.plan import ranks_of
    from .prompts import encode_prompt
    from .streams.acceptance import known

    arch = arch_of(loaded.model, loaded.config["model_type"])
    policy = TreePolicy()  # nothing drafted: a probe at every position
    rows, confidence, starts = [], [], []
    for number, prompt in enumerate(prompts, start=1):
        ids = prompt if isinstance(prompt, list) else encode_prompt(loaded, prompt)
        budget = min(max_tokens, loaded.context_length - len(ids))
        if budget < 1:
            continue
        probe: list = []
        history = list(ids)
        dec = Decoder(loaded.model, arch, params, policy, probe=probe)
        steps = decode(dec, ids, budget)
        for step in steps:
            history += step.tokens
            if any(t in loaded.eos_token_ids for t in step.tokens):
                steps.close()
                break
        starts.append(len(rows))
        rows += ranks_of(history, probe)
        confidence += [c for _, _, c in known(history, probe)]
        if on_prompt:
            on_prompt(number, len(prompts), len(rows))
    if not rows:
        raise SpecstreamError(
            "no position to count: a position counts once the "
            f"{params.config.gamma} tokens after it are decoded, and the prompts' continuations "
            "were shorter (raise --max-tokens)"
        )
    return Acceptance.from_ranks(rows, params.config.gamma, source, confidence, starts)
