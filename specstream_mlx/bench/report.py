"""A benchmark report (the JSON `run_bench` returns) as the paper-style markdown table, and as a
plot of speedup and tau per category (matplotlib: optional, `pip install specstream-mlx[plot]`).

The JSON schema (stable; new keys may be added, none renamed):

    {"suite": str,
     "machine": {"platform", "processor", "python", "backend", "blas", "mlx", "mlx_lm"},
     "provenance": {"commit", "versions": {package: version}, "machine": {...}},
     "config": {"suite", "data", "limit", "max_tokens", "methods", "adapter", "temp", "model",
                "precision", "medusa", "lora", "tree"},
     "methods": [{"name", "adapter", "speedup_vs_ar", "tokens_per_second",
                  "mean_accepted_tokens", "forward_passes", "quality": {...},
                  "identical_to_ar": float | null, "extra_params", "peak_memory_mb",
                  "prefill_seconds", "decode_seconds", "generated_tokens", "samples",
                  "tree": the speculative decoders' draft tree (generate --json's stats.tree)
                          or null,
                  "ran": [the decoders that actually ran, e.g. ["ar"] for an ss whose
                          calibrated tree is empty],
                  "per_category": {category: {the same metrics but the per-method constants}}}],
     "unavailable": {method: why it was not run}}

speedup_vs_ar is the median over prompts of ar's wall time over the method's (prefill included:
not the decode-only tokens/s ratio `generate --compare` prints);
peak_memory_mb is the method's own tensors (its model with any LoRA, the streams it runs, a
drafter's heads) plus the most MLX allocated beyond what was resident when each run started (KV
cache, activations), the largest over its runs; other models the process holds do not count;
tokens_per_second counts tokens after the first over the time after the first token; quality is
ROUGE-1 / ROUGE-Lsum F1 (dialogsum, e2e) or exact match (sql) against every reference.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecstreamError
from ..streams.acceptance import describe_rates


def _quality(q: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in q.items()) if q else "-"


def markdown(report: dict) -> str:
    """The overall table, then speedup / tau per category, then what was not run."""
    cfg, mach = report["config"], report["machine"]
    lines = [
        f"**{report['suite']}** ({cfg['data']}; {report['methods'][0]['samples']} prompts, "
        f"max {cfg['max_tokens']} tokens, temp {cfg['temp']}) | model {cfg['model'] or 'default'}"
        f" ({cfg['precision']}) | {mach['backend']} {mach['processor']}, BLAS {mach['blas']}, "
        f"mlx {mach['mlx']}, mlx-lm {mach['mlx_lm']}",
        "",
        "| method | adapter | speedup vs ar | tokens/s | tau | forward passes | quality "
        "| identical to ar | extra params | peak MB | prefill s | decode s |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for m in report["methods"]:
        identical = "-" if m["identical_to_ar"] is None else m["identical_to_ar"]
        ran = m.get("ran") or [m["name"]]
        name = m["name"] if ran == [m["name"]] else f"{m['name']} (ran {', '.join(ran)})"
        lines.append(
            f"| {name} | {m['adapter'] or '-'} | {m['speedup_vs_ar']} | "
            f"{m['tokens_per_second']} | {m['mean_accepted_tokens']} | {m['forward_passes']} | "
            f"{_quality(m['quality'])} | {identical} | {m['extra_params']} | "
            f"{m['peak_memory_mb']} | {m['prefill_seconds']} | {m['decode_seconds']} |"
        )
    for m in report["methods"]:
        tree = m.get("tree")
        if tree and tree.get("source") == "calibrated":
            lines.append(
                f"\n{m['name']}: tree chosen for this device: paths {tree['paths']} "
                f"({tree['nodes']} nodes"
                + (
                    f"; gated by stream 1's confidence at {tree['gates']}: per bin "
                    f"{tree['bin_trees']}"
                    if tree.get("bin_trees")
                    else ""
                )
                + f"), {tree['expected_tokens_per_pass']} tokens per pass and "
                f"{tree['predicted_speedup']}x predicted"
                + (
                    f" (a tree had to promise {need}x)"
                    if (need := tree.get("required_speedup"))
                    else ""
                )
            )
        elif tree and tree.get("source") == "adapter":
            lines.append(
                f"\n{m['name']}: the adapter's own tree (top-k {tree['top_k']}, "
                f"{tree['max_tree_nodes']} nodes)"
            )
        if tree and "lookup_gated" in tree:
            how = "gated by this device's latency curve" if tree["lookup_gated"] else "whole"
            grafted = tree.get("lookup") == "grafted"
            what = "lookup chains grafted onto the streams' tree" if grafted else "lookup chains"
            lines.append(f"\n{m['name']}: {what}, {how}")
    rates = report.get("stream_acceptance")
    if rates:
        lines.append("\n" + describe_rates(rates))
    categories = list(report["methods"][0]["per_category"])
    if len(categories) > 1:
        names = [m["name"] for m in report["methods"]]
        lines += [
            "",
            "Speedup vs ar / tau per category:",
            "",
            "| category | prompts | " + " | ".join(names) + " |",
            "|---|---:|" + "---:|" * len(names),
        ]
        for c in categories:
            cells = [
                f"{m['per_category'][c]['speedup_vs_ar']} / "
                f"{m['per_category'][c]['mean_accepted_tokens']}"
                for m in report["methods"]
            ]
            n = report["methods"][0]["per_category"][c]["samples"]
            lines.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
    for name, why in report.get("unavailable", {}).items():
        lines += ["", f"Not run: {name} ({why})."]
    return "\n".join(lines) + "\n"


def plot(report: dict, out: str | Path) -> None:
    """Bars of speedup vs ar and tau per category (and overall), one group per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecstreamError(
            "--plot needs matplotlib: pip install 'specstream-mlx[plot]'"
        ) from None
    methods = report["methods"]
    groups = ["overall", *methods[0]["per_category"]]
    fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.6 * len(groups) * 2), 4))
    width = 0.8 / len(methods)
    for ax, key, title in (
        (axes[0], "speedup_vs_ar", "speedup vs ar"),
        (axes[1], "mean_accepted_tokens", "tokens per forward pass (tau)"),
    ):
        for i, m in enumerate(methods):
            values = [m[key]] + [m["per_category"][g][key] for g in groups[1:]]
            xs = [g + (i - (len(methods) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, values, width, label=m["name"])
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"{report['suite']} ({report['machine']['backend']})")
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out)
