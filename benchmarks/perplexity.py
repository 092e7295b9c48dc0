"""Perplexity of a model on the start of WikiText-2 validation (the golden-test slice).

./dev.sh python benchmarks/perplexity.py [--model M] [--precision P] [--tokens 512,1024]
    [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
from specstream_mlx.metrics import perplexity  # noqa: E402
# isort: on

FIRST_CHARS = 20_000  # the golden tests tokenize this prefix of valid.txt, without BOS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--tokens", default="512,1024")
    default_data = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument("--data", default=os.environ.get("SPECSTREAM_DATA", default_data))
    args = parser.parse_args()

    loaded = ss.load(args.model, precision=args.precision)
    text = (Path(args.data) / "wikitext2" / "valid.txt").read_text()[:FIRST_CHARS]
    ids = loaded.tokenizer.encode(text)
    for n in (int(t) for t in args.tokens.split(",")):
        print(
            f"{loaded.name} ({loaded.precision}): perplexity on the first {n} tokens of "
            f"wikitext2 valid = {perplexity(loaded.model, ids[:n]):.2f}"
        )


if __name__ == "__main__":
    main()
