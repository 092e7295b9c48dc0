"""A task LoRA and lossless streams trained over it, packed as one adapter for the untouched
base: shared mode with `main_reads_streams` false, so `ss` decodes exactly the LoRA's answers
and the streams draft for them (issue 20: a writing tool that keeps its next-token baseline's
quality by construction).

    ./dev.sh python scripts/pack_lora_streams.py LORA_FOLDER STREAMS_FOLDER OUT [--model NAME]

The recipe: `scripts/fuse_next_token.py LORA_FOLDER MERGED` (the LoRA merged into a model
folder), lossless streams trained on MERGED (`specstream train --model MERGED --mode lossless
--targets self ...`, or `python -m convert.torch_train` then `specstream convert`, parent heads
and a draft vocabulary as any lossless adapter), then this script with the base model. OUT is
built beside its place and renamed into it; it records both folders' training records (their
data's licences) and keeps the streams' acceptance.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("lora", help="a next-token LoRA folder (specstream train --mode next-token)")
    p.add_argument("streams", help="a lossless stream adapter trained on the LoRA's merged model")
    p.add_argument("out", help="the adapter folder to write (a new one)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT")
    p.add_argument("--model", default=None, help="the base model (default: the default model)")
    args = p.parse_args()
    from specstream_apps.args import output_folder

    import specstream_mlx as ss
    from specstream_mlx.streams.adapter_io import pack_lora_streams

    try:
        output_folder(args.out, "OUT", args.overwrite)
        loaded = ss.load(args.model)
        pack_lora_streams(args.lora, args.streams, args.out, loaded, args.overwrite)
    except (ss.SpecstreamError, OSError) as exc:
        print(f"pack_lora_streams: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {args.lora}'s LoRA and {args.streams}'s streams, for {loaded.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
