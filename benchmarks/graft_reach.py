"""Whether the nodes prompt lookup grafts onto the streams' tree (`ss+pld`, greedy) are taken,
against the chance of reaching them that the lookup gate priced them at (issue 18). Each
grafted chain is keyed by where it hangs (`root`, or `deep`: past the streams' deepest path)
and whether its first token is already a child there (`shared-head`, the streams drafted it
too) or not (`new-head`); its new nodes (the ones the gate kept) by their index among them.
A node is taken when the decoded text goes through it (for a deep chain, the streams' path
too); nodes past the generation's end are left out.

Prints, per chain kind, how often its first token was right where the text reached it, and
per kind and new-node index the nodes, the share taken and the gate's mean priced reach.

    ./dev.sh python benchmarks/graft_reach.py --adapter summarize --suite dialogsum
        --data ../shared/data/dialogsum/dev.jsonl [--limit 10] [--max-tokens 96] [--json OUT]
"""

from __future__ import annotations

from collections import defaultdict

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx import session  # noqa: E402
from specstream_mlx.decoding import lookup  # noqa: E402
from specstream_mlx.provenance import provenance  # noqa: E402

# isort: on
from paired import arguments, suite_prompts, write  # noqa: E402

GRAFTER, GRAFT, WORTH = session.lookup_grafter, lookup.graft, lookup.LookupGate.worth


class Recorder:
    """Every chain grafted in one generation: (history length, the node it hangs from, the
    tokens on the path to that node, the chain, how many of its first tokens the tree already
    had, the priced reach of each new node kept)."""

    def __init__(self):
        self.chains, self.history, self.priced = [], 0, []

    def grafter(self, *args, **kwargs):
        inner = GRAFTER(*args, **kwargs)

        def grafted(history, tree, confidence):
            self.history = len(history)
            return inner(history, tree, confidence)

        return grafted

    def worth(self, gate, reach, nodes):
        kept = WORTH(gate, reach, nodes)
        self.priced.append((reach, kept))
        return kept

    def graft(self, tree, at, tokens, keep=None):
        self.priced = []
        out = GRAFT(tree, at, tokens, keep)
        if tokens:
            reach = [r for r, kept in self.priced if kept]
            if keep is None:
                reach = [1.0] * (len(out) - len(tree))
            shared = len(_walk(tree, at, tokens))
            self.chains.append((self.history, at, _path(tree, at), list(tokens), shared, reach))
        return out


def _path(tree, node: int) -> list[int]:
    path = []
    while node > 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


def _walk(tree, at: int, tokens: list[int]) -> list[int]:
    """The nodes the chain `tokens` under `at` already has, in order."""
    nodes = []
    for token in tokens:
        kids = [c for c in range(len(tree)) if tree.parents[c] == at and tree.tokens[c] == token]
        if not kids:
            break
        at = kids[0]
        nodes.append(at)
    return nodes


def score(chains: list, text: list[int], heads: dict, nodes: dict) -> None:
    """Add one generation's chains, settled against its decoded `text` (prompt included)."""
    for history, at, path, chain, shared, reach in chains:
        start = history + len(path)
        kind = ("root" if at == 0 else "deep") + (" shared-head" if shared else " new-head")
        on_path = text[history:start] == path
        if on_path and start < len(text):
            heads[kind][0] += 1
            heads[kind][1] += text[start] == chain[0]
        for j, priced in enumerate(reach):
            end = start + shared + j + 1
            if end > len(text):
                break
            row = nodes[f"{kind} new#{min(j, 3)}"]
            row[0] += 1
            row[1] += on_path and text[start:end] == chain[: shared + j + 1]
            row[2] += priced


def main() -> None:
    args = arguments(__doc__)
    loaded = ss.load(args.model, args.adapter)
    prompts = suite_prompts(loaded, args)
    recorder = Recorder()
    session.lookup_grafter, lookup.graft = recorder.grafter, recorder.graft
    lookup.LookupGate.worth = lambda gate, reach, nodes: recorder.worth(gate, reach, nodes)
    heads, nodes = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0, 0.0])
    for prompt in prompts:
        recorder.chains = []
        out = ss.generate(loaded, prompt, max_tokens=args.max_tokens, decoder="ss+pld")
        score(recorder.chains, list(prompt) + list(out.token_ids), heads, nodes)
    for kind, (reached, right) in sorted(heads.items()):
        print(f"{kind}: {reached} chains reached, first token right {right / reached:.2f}")
    rows = {}
    for key, (count, taken, priced) in sorted(nodes.items()):
        row = {"nodes": count, "taken": round(taken / count, 3)}
        rows[key] = {**row, "priced_reach": round(priced / count, 3)}
        print(f"{key}: {count} nodes, taken {row['taken']}, priced {rows[key]['priced_reach']}")
    heads_out = {k: {"reached": c, "first_right": round(r / c, 3)} for k, (c, r) in heads.items()}
    write(args, prompts, {"chain_heads": heads_out, "new_nodes": rows}, provenance())


if __name__ == "__main__":
    main()
