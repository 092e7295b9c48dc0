"""Acceptance statistics of an adapter's streams: how often each stream's target sat at each rank
of its proposals (counted on real positions), stored as acceptance.json beside the adapter's
weights. The decoder chooses its static tree for a device from them (decoding.plan)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecstreamError

Path_ = tuple[int, ...]
PROBE_TOP_K = 8  # ranks counted per stream; a target outside the top 8 ends its path
ACCEPTANCE_FILE = "acceptance.json"


@dataclass
class Acceptance:
    """How often the targets of gamma streams sat at each rank path, over `positions` positions.

    counts[(i1, ..., ij)] = positions where stream 1's target was its i1-th best token, ..., stream
    j's its ij-th best (ranks from 0, below PROBE_TOP_K)."""

    gamma: int
    positions: int
    counts: dict[Path_, int]
    source: str = ""

    @classmethod
    def from_ranks(cls, ranks: Sequence[Sequence[int]], gamma: int, source: str = ""):
        """ranks: per position, the rank of each stream's target (>= PROBE_TOP_K: not drafted)."""
        counts: dict[Path_, int] = {}
        for row in ranks:
            path: Path_ = ()
            for rank in list(row)[:gamma]:
                if rank >= PROBE_TOP_K:
                    break
                path += (int(rank),)
                counts[path] = counts.get(path, 0) + 1
        return cls(gamma, len(ranks), counts, source)

    def probability(self, path: Path_) -> float:
        return self.counts.get(path, 0) / self.positions if self.positions else 0.0

    def rates(self, top: int = 3) -> dict:
        """What users ask of speculation, per stream j = 1..gamma: P(its top guess is right |
        streams 1..j-1 right) and P(its target is in its top `top` | theirs were in theirs).
        For stream 1 these are its plain top-1 and top-3 accuracy."""

        def share(j: int, within: int) -> float:
            def mass(depth: int) -> int:
                if depth == 0:
                    return self.positions
                return sum(n for p, n in self.counts.items() if len(p) == depth and max(p) < within)

            below = mass(j - 1)
            return round(mass(j) / below, 4) if below else 0.0

        return {
            "positions": self.positions,
            "source": self.source,
            "top1_given_earlier_right": [share(j, 1) for j in range(1, self.gamma + 1)],
            f"top{top}_given_earlier_in_top{top}": [
                share(j, top) for j in range(1, self.gamma + 1)
            ],
        }

    def to_dict(self) -> dict:
        return {
            "format_version": 1,
            "gamma": self.gamma,
            "top_k": PROBE_TOP_K,
            "positions": self.positions,
            "source": self.source,
            "counts": {".".join(map(str, p)): n for p, n in sorted(self.counts.items())},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Acceptance:
        try:
            counts = {
                tuple(int(r) for r in k.split(".")): int(v) for k, v in data["counts"].items()
            }
            out = cls(
                int(data["gamma"]), int(data["positions"]), counts, str(data.get("source", ""))
            )
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise SpecstreamError(f"bad acceptance statistics: {exc!r}") from None

        def fits(p: Path_) -> bool:
            parent = out.positions if len(p) == 1 else counts.get(p[:-1], -1)
            return len(p) <= out.gamma and min(p) >= 0 and 0 <= counts[p] <= parent

        if out.positions < 0 or not all(fits(p) for p in counts):
            raise SpecstreamError(
                "bad acceptance statistics: a path deeper than gamma, a negative rank or count, "
                "or a path counted more often than its parent"
            )
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
        return Acceptance(self.gamma, self.positions + other.positions, counts, self.source)


def ranks_of(history: Sequence[int], probes: Sequence[tuple[int, list[list[int]]]]) -> list:
    """Rank rows from a greedy decode: each probe is (h, top) where top[j] lists stream j's best
    tokens proposed when the context held h tokens, so stream j's target is history[h + j].
    Probes whose targets are not all known yet are skipped."""
    rows = []
    for h, top in probes:
        if h + len(top) > len(history):
            continue
        row = []
        for j, best in enumerate(top):
            target = history[h + j]
            row.append(best.index(target) if target in best else PROBE_TOP_K)
        rows.append(row)
    return rows
