"""Issue 20's curves as plots: what the lossless streams of each ablation row predict, what the
base model's own head names at every depth, and how each row's training loss fell.

Reads the rows' validation records (benchmarks/validate_streams.py JSON, one per row, named
ROW.json; ROW_nll, ROW_with_the_true_next_token and ROW_on_its_training_rows are a row scored
another way, not plotted), the logit
lens (benchmarks/logit_lens.py JSON) and, where `--runs` holds the rows' adapter folders, their
loss curves (`training.loss_curve` in ROW/adapter_config.json, or the full history in
ROW_progress.json, a copy of a checkpoint's progress.json). Writes four PNGs:

- stream_rows.png: the rows at the issue's budget (scripts/stream_ablation.sh's, 400-500 steps):
  stream j's top-1 (j = 1..4) per row; the tau of the best static tree of 4 / 8 / 16 nodes per
  row; stream-1 top-1 against the number of distilled answers, at a fixed step budget (rows nN)
  and at a fixed epoch count (rows eN); the issue's targets drawn where they apply (stream-1
  0.45, 8-node tau 1.8);
- longer_runs.png: the same two panels for the longer runs (e3000, msa12long, the GPU rows,
  the shipped chat's rounds);
- logit_lens.png: the base head's top-1 for the next token after every block, with the pruning
  points of 4, 8 and 12 MSA layers and each row's early-exit top-1;
- loss_curves.png: training loss against step per row (rows with a curve only).

    ./dev.sh python benchmarks/plot_streams.py [--rows docs/results/stream_ablation]
        [--lens docs/results/logit_lens.json] [--runs ../runs/ablation] [--out docs/plots]

Needs matplotlib (`pip install 'specstream-mlx[plot]'`; dev.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specstream_mlx.training.history import loss_curve  # noqa: E402

TARGET_STREAM1, TARGET_TAU8 = 0.45, 1.8  # issue 20's chat targets
SAME_BUDGET = r"n1000|n3000|e1000|soft|r32|r64(lr)?|msa\d+|attn|guess|medusa"
VARIANTS = ("_nll", "_with_the_true_next_token", "_on_its_training_rows")  # scored another way


def read_rows(folder: Path) -> dict[str, dict]:
    """Row name -> its validation record, n1000 first, then by name."""
    rows = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    return dict(sorted(rows.items(), key=lambda kv: (kv[0] != "n1000", kv[0])))


def row_msa_layers(row: str) -> int:
    """The MSA layers of an ablation row (scripts/stream_ablation.sh: msaN rows, else 8)."""
    m = re.fullmatch(r"msa(\d+)", row)
    return int(m[1]) if m else 8


def loss_points(runs: Path | None, row: str) -> list[tuple[float, float]]:
    """(step, loss) of a row's training, from its adapter config or a copied progress file."""
    if runs is None:
        return []
    progress, config = runs / f"{row}_progress.json", runs / row / "adapter_config.json"
    if progress.is_file():  # the windows `specstream train` keeps with an adapter
        curve = loss_curve(json.loads(progress.read_text())["history"])
    elif config.is_file():
        curve = json.loads(config.read_text()).get("training", {}).get("loss_curve", [])
    else:
        curve = []
    return [(w["steps"][1], w["loss"]) for w in curve]


def data_curve(rows: dict[str, dict], prefix: str) -> list[tuple[int, float]]:
    """(answers, stream-1 top-1) of the rows named prefix + N (nN: a fixed step budget, eN: a
    fixed epoch count), by N."""
    pattern = re.compile(prefix + r"(\d+)")
    found = ((pattern.fullmatch(n), r) for n, r in rows.items())
    return sorted((int(m[1]), r["stream_accuracy"][0]) for m, r in found if m)


def same_budget(name: str) -> bool:
    """Whether a row is one of scripts/stream_ablation.sh's rows at the issue's budget (400-500
    steps of 4 on 1,000-3,000 answers), not a longer run (e3000, msa12long, the GPU rows, the
    shipped chat's rounds)."""
    return re.fullmatch(SAME_BUDGET, name) is not None


def stream_panels(acc, tau, rows: dict[str, dict], target_tau: bool = True) -> None:
    """Stream j's top-1 and the best static trees' tau, a line per row."""
    for name, r in rows.items():
        acc.plot(range(1, len(r["stream_accuracy"]) + 1), r["stream_accuracy"], "o-", label=name)
        nodes = sorted(int(k) for k in r["tau_static"])
        tau.plot(nodes, [r["tau_static"][str(n)] for n in nodes], "o-", label=name)
    acc.axhline(TARGET_STREAM1, color="grey", ls="--", lw=1)
    acc.annotate("target, stream 1", (1, TARGET_STREAM1), xytext=(1.1, TARGET_STREAM1 - 0.03))
    acc.set(xlabel="stream j", ylabel="top-1 on the dev answers")
    acc.set_xticks(range(1, 5))
    if target_tau:
        tau.plot([8], [TARGET_TAU8], "k*", ms=12, label="target (8 nodes)")
    tau.set(xlabel="nodes of the best static tree", ylabel="tau (tokens per pass)")
    tau.set_xticks([4, 8, 16])
    acc.legend(fontsize=7)
    tau.legend(fontsize=7)


def plot_rows(rows: dict[str, dict], out: Path) -> None:
    """The same-budget rows' panels, and the data curves of every nN and eN row."""
    fig, (acc, tau, data) = plt.subplots(1, 3, figsize=(15, 4.5))
    stream_panels(acc, tau, {k: v for k, v in rows.items() if same_budget(k)})
    acc.set(title="Stream top-1 per row (400-500 steps)")
    tau.set(title="Best static trees")
    points = 0
    for prefix, label in (("n", "400 steps of 4"), ("e", "2 epochs (N / 2 steps of 4)")):
        sizes = data_curve(rows, prefix)
        if sizes:
            data.plot([n for n, _ in sizes], [s for _, s in sizes], "o-", label=label)
        points += len(sizes)
    data.axhline(TARGET_STREAM1, color="grey", ls="--", lw=1)
    data.set(xlabel="distilled answers N", ylabel="stream-1 top-1", ylim=(0, 0.5))
    data.set(title=f"Data curves ({points} point{'s' if points != 1 else ''})")
    data.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "stream_rows.png", dpi=90)
    plt.close(fig)


def plot_longer(rows: dict[str, dict], out: Path) -> None:
    """The longer runs (thousands of steps, the shipped chat's rounds) on the same dev answers."""
    fig, (acc, tau) = plt.subplots(1, 2, figsize=(13, 4.8))
    stream_panels(acc, tau, rows)
    acc.set(title="Stream top-1, longer runs")
    tau.set(title="Best static trees, longer runs")
    fig.tight_layout()
    fig.savefig(out / "longer_runs.png", dpi=90)
    plt.close(fig)


def plot_lens(lens: dict, rows: dict[str, dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    blocks = sorted(int(k) for k in lens["top1_after_block"])
    ax.plot(
        blocks,
        [lens["top1_after_block"][str(b)] for b in blocks],
        "o-",
        ms=3,
        label="base head after block b",
    )
    n_layers = blocks[-1]
    for msa in (4, 8, 12):
        ax.axvline(n_layers - msa, color="grey", ls=":", lw=1)
        ax.annotate(
            f"{msa} MSA layers start",
            (n_layers - msa, 0.9),
            rotation=90,
            fontsize=8,
            xytext=(n_layers - msa - 0.8, 0.62),
        )
    ax.plot(
        [lens["pruning_point"]],
        [lens["early_exit_top1"]],
        "s",
        label=f"early exit of {lens['adapter']}",
    )
    for name, r in rows.items():
        if r.get("early_exit_top1") is not None and same_budget(name):
            point = n_layers - row_msa_layers(name)
            ax.plot([point], [r["early_exit_top1"]], "^", label=f"early exit, {name}")
    ax.axhline(TARGET_STREAM1, color="grey", ls="--", lw=1)
    ax.set(
        xlabel="block",
        ylabel="top-1 for the next token",
        ylim=(0, 1.02),
        title=f"What the base names at each depth ({lens['positions']} positions)",
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "logit_lens.png", dpi=90)
    plt.close(fig)


def plot_losses(curves: dict[str, list], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, points in curves.items():
        ax.plot([s for s, _ in points], [v for _, v in points], label=name)
    ax.set(
        xlabel="step (batch 4)",
        ylabel="training loss (4 streams + early-exit head)",
        title="Training loss per row",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss_curves.png", dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="docs/results/stream_ablation")
    parser.add_argument("--lens", default="docs/results/logit_lens.json")
    parser.add_argument("--runs", default=None, help="the rows' run folder (loss curves)")
    parser.add_argument("--out", default="docs/plots")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {k: v for k, v in read_rows(Path(args.rows)).items() if "tau_static" in v}
    plot_rows(rows, out)
    longer = {k: v for k, v in rows.items() if not (same_budget(k) or k.endswith(VARIANTS))}
    if longer:
        plot_longer(longer, out)
    plot_lens(json.loads(Path(args.lens).read_text()), rows, out)
    runs = Path(args.runs) if args.runs else None
    curves = {name: pts for name in rows if (pts := loss_points(runs, name))}
    if curves:
        plot_losses(curves, out)
    written = ["stream_rows.png", "logit_lens.png"] + ["longer_runs.png"] * bool(longer)
    print(f"wrote {out}/: " + ", ".join(written + ["loss_curves.png"] * bool(curves)))


if __name__ == "__main__":
    main()
