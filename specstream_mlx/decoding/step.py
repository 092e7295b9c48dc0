"""What every decoder yields per forward pass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Step:
    tokens: list[int]  # tokens this pass decided (for a tree: accepted path + correction token)
    tree_nodes: int = 1  # drafted nodes, before pruning
    tree_nodes_kept: int = 1  # nodes after pruning (entered the MSA layers)
