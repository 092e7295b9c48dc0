"""A shared-mode adapter made into one whose main stream ignores its streams
(`main_reads_streams: false`): plain decoding runs its LoRA alone, without the stream rows a
shared main stream attends to on every step, and `ss` stays exact against that. Its answers
become its LoRA's alone, so they move a little: measure their quality before shipping it.

    ./dev.sh python scripts/main_ignores_streams.py ADAPTER OUT [--model NAME]
    ./dev.sh specstream calibrate --adapter OUT --measure-acceptance --overwrite --suite S --data D

Files are copied unchanged but the config (which records ADAPTER and its weights' sha256); OUT
is built beside its place and renamed into it. Measure acceptance.json again afterwards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("adapter", help="a shared-mode adapter folder (or a shipped adapter's name)")
    p.add_argument("out", help="the adapter folder to write (a new one)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT")
    p.add_argument("--model", default=None, help="the base model (default: the default model)")
    args = p.parse_args()
    from specstream_apps.args import output_folder

    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import main_ignoring_streams

    try:
        output_folder(args.out, "OUT", args.overwrite)
        loaded = ss.load(args.model)
        main_ignoring_streams(args.adapter, args.out, loaded, args.overwrite)
    except (ss.SpecstreamError, OSError) as exc:
        print(f"main_ignores_streams: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {args.adapter} with a main stream that ignores its streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
