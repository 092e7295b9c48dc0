"""Give a trained stream adapter a draft vocabulary without training it again: the K commonest
target tokens of --data (what `specstream train --draft-vocab K` keeps at the end of a run),
written into a copy of the folder, built beside it and renamed into place; the weights, README
and acceptance statistics are copied unchanged (the statistics were measured with the whole
head: `specstream calibrate --adapter OUT --measure-acceptance ...` measures them again).

    ./dev.sh python scripts/draft_vocab.py --adapter chat --data TRAIN.jsonl --size 8192 \
        --out ../runs/chat_vocab [--task T] [--model M] [--overwrite]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import replace

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_apps.args import output_folder, positive_int  # noqa: E402
from specstream_mlx.folders import staged_folder  # noqa: E402
from specstream_mlx.streams.adapter_io import CONFIG, read_adapter, resolve_adapter  # noqa: E402
from specstream_mlx.streams.config import StreamConfig  # noqa: E402
from specstream_mlx.training.data import draft_vocabulary, load_dataset  # noqa: E402
# isort: on


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapter", required=True, help="a stream adapter folder or shipped name")
    p.add_argument("--data", required=True, help="its training data (jsonl, or a task's file)")
    p.add_argument("--task", default=None, help="the task the data file is shaped for")
    p.add_argument("--size", type=positive_int, required=True, help="K: tokens kept")
    p.add_argument("--out", required=True, help="the new adapter folder")
    p.add_argument("--model", default=None)
    p.add_argument("--max-length", type=positive_int, default=512)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args()
    try:
        output_folder(args.out, "--out", args.overwrite)
        loaded = ss.load(args.model)
        source = resolve_adapter(args.adapter, loaded)
        if read_adapter(source, loaded).streams is None:
            raise ss.SpecstreamError(f"{args.adapter}: not a stream adapter")
        data = load_dataset(args.data, loaded.tokenizer, args.max_length, args.task)
        vocab = draft_vocabulary(data.examples, args.size)
        config = json.loads((source / CONFIG).read_text())
        stream_config = StreamConfig.from_dict(config["stream_config"])
        config["stream_config"] = replace(stream_config, draft_vocab=vocab).validate().to_dict()
        config["draft_vocab_from"] = {"data": str(args.data), "size": len(vocab)}
        with staged_folder(args.out, overwrite=args.overwrite) as tmp:
            for path in source.iterdir():
                if path.is_file() and path.name != CONFIG:
                    shutil.copy2(path, tmp / path.name)
            (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
            try:  # the runtime must accept it before it takes the name
                read_adapter(tmp, loaded)
            except ss.SpecstreamError as exc:  # named as the folder it would have been
                raise ss.SpecstreamError(str(exc).replace(str(tmp), str(args.out))) from None
    except ss.SpecstreamError as exc:
        print(f"draft_vocab: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(vocab)} draft tokens from {len(data)} examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
