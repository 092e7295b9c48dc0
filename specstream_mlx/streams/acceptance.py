"""Acceptance statistics of an adapter's streams: how often each stream's target sat at each rank
of its proposals (counted on real positions), stored as acceptance.json beside the adapter's
weights. The decoder chooses its static tree for a device from them (decoding.plan)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecstreamError

Path_ = tuple[int, ...]
PROBE_TOP_K = 8  # ranks counted per stream; a target outside the top 8 ends its path
ACCEPTANCE_FILE = "acceptance.json"
CONFIDENCE_BINS = 4  # positions split by stream 1's confidence: its quartiles


@dataclass(frozen=True)
class Trace:
    """The probed positions in decoding order, which is what a speculative decode's passes walk
    (each pass starts where the last one's accepted path ended): per position, the rank of each
    stream's target and stream 1's confidence (the probability of its top token); `starts`:
    where each decode's positions begin."""

    ranks: np.ndarray  # (P, gamma) ints, PROBE_TOP_K where the target was not proposed
    confidence: np.ndarray  # (P,)
    starts: tuple[int, ...]

    def to_dict(self) -> dict:
        return {
            "starts": list(self.starts),
            "ranks": ["".join(str(int(r)) for r in row) for row in self.ranks],
            "confidence": [round(float(c), 4) for c in self.confidence],
        }

    @classmethod
    def from_dict(cls, data: dict, gamma: int) -> Trace:
        try:
            ranks = np.array([[int(c) for c in row] for row in data["ranks"]], dtype=np.int64)
            confidence = np.array([float(c) for c in data["confidence"]])
            starts = tuple(int(i) for i in data["starts"])
        except (KeyError, ValueError, TypeError) as exc:
            raise SpecstreamError(f"bad acceptance trace: {exc!r}") from None
        n = len(confidence)
        if (
            ranks.shape != (n, gamma)
            or (n and (ranks.min() < 0 or ranks.max() > PROBE_TOP_K))
            or not np.all((confidence >= 0) & (confidence <= 1))
            or list(starts) != sorted(set(starts))
            or (starts and (starts[0] != 0 or starts[-1] >= n))
        ):
            raise SpecstreamError(
                f"bad acceptance trace: {n} positions of {gamma} ranks from 0 to {PROBE_TOP_K}, "
                "confidences between 0 and 1 and ascending starts from 0 expected"
            )
        return cls(ranks.reshape(n, gamma), confidence, starts)


@dataclass
class Acceptance:
    """How often the targets of gamma streams sat at each rank path, over `positions` positions.

    counts[(i1, ..., ij)] = positions where stream 1's target was its i1-th best token, ..., stream
    j's its ij-th best (ranks from 0, below PROBE_TOP_K)."""

    gamma: int
    positions: int
    counts: dict[Path_, int]
    source: str = ""
    # per stream j, positions where its target was its best token / among its 3 best, whatever
    # the earlier streams did (None: statistics saved before these were kept)
    top1: list[int] | None = None
    top3: list[int] | None = None
    trace: Trace | None = None  # the positions in order (None: only counted)
    # with a trace, the counts split by stream 1's confidence at its quartiles: bins[b] holds
    # the positions with gates[b - 1] <= confidence < gates[b]
    gates: tuple[float, ...] = ()
    bins: list[Acceptance] | None = None

    @classmethod
    def from_ranks(
        cls,
        ranks: Sequence[Sequence[int]],
        gamma: int,
        source: str = "",
        confidence: Sequence[float] | None = None,
        starts: Sequence[int] = (0,),
    ):
        """ranks: per position, the rank of each stream's target (>= PROBE_TOP_K: not drafted).
        With `confidence` (per position, stream 1's probability of its top token) the positions
        are kept in order as a trace (`starts`: where each decode begins) and the counts split
        into CONFIDENCE_BINS bins at the confidence's quantiles."""
        if confidence is not None:
            return cls._traced(ranks, gamma, source, confidence, starts)
        counts: dict[Path_, int] = {}
        top1, top3 = [0] * gamma, [0] * gamma
        for row in ranks:
            path: Path_ = ()
            for j, rank in enumerate(list(row)[:gamma]):
                top1[j] += rank == 0
                top3[j] += rank < 3
            for rank in list(row)[:gamma]:
                if rank >= PROBE_TOP_K:
                    break
                path += (int(rank),)
                counts[path] = counts.get(path, 0) + 1
        return cls(gamma, len(ranks), counts, source, top1, top3)

    @classmethod
    def _traced(cls, ranks, gamma: int, source: str, confidence, starts) -> Acceptance:
        if len(confidence) != len(ranks):
            raise SpecstreamError(f"{len(confidence)} confidences for {len(ranks)} positions")
        whole = cls.from_ranks(ranks, gamma, source)
        rows = np.minimum(np.array(ranks, dtype=np.int64).reshape(len(ranks), gamma), PROBE_TOP_K)
        conf = np.round(np.asarray(confidence, dtype=float), 4)
        starts = tuple(sorted({0, *(i for i in starts if 0 <= i < len(rows))})) if len(rows) else ()
        whole.trace = Trace(rows, conf, starts)
        qs = np.quantile(conf, np.arange(1, CONFIDENCE_BINS) / CONFIDENCE_BINS) if len(conf) else []
        gates = sorted({round(float(q), 4) for q in qs})
        while True:  # ties leave bins empty: each merges into its neighbour
            which = np.searchsorted(gates, conf, side="right")
            empty = np.flatnonzero(np.bincount(which, minlength=len(gates) + 1) == 0)
            if not len(empty) or not gates:
                break
            del gates[min(int(empty[0]), len(gates) - 1)]
        whole.gates = tuple(gates)
        whole.bins = [
            cls.from_ranks(rows[which == i].tolist(), gamma, source) for i in range(len(gates) + 1)
        ]
        return whole

    def probability(self, path: Path_) -> float:
        return self.counts.get(path, 0) / self.positions if self.positions else 0.0

    def rates(self, top: int = 3) -> dict:
        """What users ask of speculation, per stream j = 1..gamma: its top-1 and top-3 accuracy
        (None for statistics saved without them), P(its top guess is right | streams 1..j-1
        right) and P(its target is in its top `top` | theirs were in theirs)."""

        def share(j: int, within: int) -> float:
            def mass(depth: int) -> int:
                if depth == 0:
                    return self.positions
                return sum(n for p, n in self.counts.items() if len(p) == depth and max(p) < within)

            below = mass(j - 1)
            return round(mass(j) / below, 4) if below else 0.0

        def alone(hits: list[int] | None) -> list[float] | None:
            if hits is None or not self.positions:
                return None
            return [round(h / self.positions, 4) for h in hits]

        return {
            "positions": self.positions,
            "source": self.source,
            "top1": alone(self.top1),
            "top3": alone(self.top3),
            "top1_given_earlier_right": [share(j, 1) for j in range(1, self.gamma + 1)],
            f"top{top}_given_earlier_in_top{top}": [
                share(j, top) for j in range(1, self.gamma + 1)
            ],
        }

    def to_dict(self) -> dict:
        out = {
            "format_version": 1,
            "gamma": self.gamma,
            "top_k": PROBE_TOP_K,
            "positions": self.positions,
            "source": self.source,
            "counts": {".".join(map(str, p)): n for p, n in sorted(self.counts.items())},
            **({"top1": self.top1, "top3": self.top3} if self.top1 is not None else {}),
        }
        if self.trace is not None:
            out["trace"] = self.trace.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Acceptance:
        if not isinstance(data, dict):
            raise SpecstreamError("bad acceptance statistics: not a JSON object")
        try:
            counts = {
                tuple(int(r) for r in k.split(".")): int(v) for k, v in data["counts"].items()
            }
            hits = [[int(n) for n in data[k]] if k in data else None for k in ("top1", "top3")]
            out = cls(
                int(data["gamma"]),
                int(data["positions"]),
                counts,
                str(data.get("source", "")),
                *hits,
            )
        except KeyError as exc:
            raise SpecstreamError(f"bad acceptance statistics: no {exc.args[0]!r} field") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise SpecstreamError(f"bad acceptance statistics: {exc!r}") from None

        def fits(p: Path_) -> bool:
            parent = out.positions if len(p) == 1 else counts.get(p[:-1], -1)
            return len(p) <= out.gamma and min(p) >= 0 and 0 <= counts[p] <= parent

        def fits_hits(hits: list[int] | None) -> bool:
            return hits is None or (
                len(hits) == out.gamma and all(0 <= n <= out.positions for n in hits)
            )

        if (
            out.positions < 0
            or not all(fits(p) for p in counts)
            or not all(fits_hits(h) for h in (out.top1, out.top3))
        ):
            raise SpecstreamError(
                "bad acceptance statistics: a path deeper than gamma, a negative rank or count, "
                "a path counted more often than its parent, or per-stream hits that do not fit"
            )
        if "trace" in data:
            return _traced(out, Trace.from_dict(data["trace"], out.gamma))
        return out

    @classmethod
    def read(cls, folder: Path) -> Acceptance | None:
        """The folder's acceptance.json, or None when it has none."""
        path = Path(folder) / ACCEPTANCE_FILE
        if not path.is_file():
            return None
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise SpecstreamError(f"unreadable {path}: {exc}") from None

    def merged(self, other: Acceptance) -> Acceptance:
        counts = dict(self.counts)
        for p, n in other.counts.items():
            counts[p] = counts.get(p, 0) + n

        def add(a: list[int] | None, b: list[int] | None) -> list[int] | None:
            return None if a is None or b is None else [x + y for x, y in zip(a, b, strict=True)]

        return Acceptance(
            self.gamma,
            self.positions + other.positions,
            counts,
            self.source,
            add(self.top1, other.top1),
            add(self.top3, other.top3),
        )


def _traced(counted: Acceptance, trace: Trace) -> Acceptance:
    """`counted` with its trace, which must give the same counts."""
    out = Acceptance.from_ranks(
        trace.ranks.tolist(), counted.gamma, counted.source, trace.confidence, trace.starts
    )
    if out.positions != counted.positions or out.counts != {
        p: n for p, n in counted.counts.items() if n
    }:
        raise SpecstreamError("bad acceptance statistics: the trace does not give the counts")
    return out


def describe_rates(rates: dict) -> str:
    """One line of `Acceptance.rates()` for a terminal or a markdown report."""
    alone = (
        f"top-1 {rates['top1']}, top-3 {rates['top3']}; " if rates.get("top1") is not None else ""
    )
    return (
        f"streams on {rates['positions']} positions ({rates['source']}): {alone}top-1 given "
        f"the earlier streams right {rates['top1_given_earlier_right']}, top-3 given theirs in "
        f"top-3 {rates['top3_given_earlier_in_top3']}"
    )


def ranks_of(history: Sequence[int], probes: Sequence[tuple]) -> list:
    """Rank rows from a greedy decode: each probe is (h, top, ...) where top[j] lists stream
    j's best tokens proposed when the context held h tokens, so stream j's target is
    history[h + j]. Probes whose targets are not all known yet are skipped."""
    rows = []
    for h, top, *_ in known(history, probes):
        row = []
        for j, best in enumerate(top):
            target = history[h + j]
            row.append(best.index(target) if target in best else PROBE_TOP_K)
        rows.append(row)
    return rows


def known(history: Sequence[int], probes: Sequence[tuple]) -> list[tuple]:
    """The probes whose every stream's target is in `history`."""
    return [p for p in probes if p[0] + len(p[1]) <= len(history)]
