"""Pin llama.cpp's view of a GGUF file: its token ids for a set of strings and its WikiText-2
perplexity, as the independent reference the real-model tests compare against.

Needs llama-cpp-python (not a project dependency: `pip install llama-cpp-python` builds llama.cpp
from source, about 30 minutes on a 2-core machine), run in its own environment:

    /path/to/venv-with-llama-cpp/bin/python scripts/llamacpp_reference.py GGUF WIKITEXT OUT.json

WIKITEXT is `../shared/data/wikitext2/valid.txt`; its first 20,000 characters are tokenized by
llama.cpp without BOS and the first 512 and 1,024 tokens scored, exactly as the tests do.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

FIRST_CHARS = 20_000
STRINGS = [
    "12345 hello world 3.14159e-10 + 0x1F",
    "def f(x):\n    return x**2  # square\n\n\n",
    "   leading   and trailing   \t\ttabs\r\nwindows\r\n",
    "I'm, you'RE, they'll, WE'D",
    "中文测试，日本語のテキスト、한국어",
    "Привет, мир! Ünïcödé café naïve — “quotes”",
    "SELECT COUNT(*) FROM users WHERE id = 42;",
    "emoji 😀👍🏽 done",
    " \n = Homarus gammarus = \n",
]


def perplexity(llm, ids: list[int]) -> float:
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logprobs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return math.exp(-logprobs[np.arange(len(ids) - 1), ids[1:]].mean())


def main(gguf: str, wikitext: str, out: str) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(
        gguf, n_ctx=1024, n_batch=1024, logits_all=True, n_threads=2, verbose=False
    )
    text = open(wikitext, encoding="utf-8").read()[:FIRST_CHARS]
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    result = {
        "reference": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp), n_threads=2, CPU, "
        "same GGUF",
        "wikitext2_valid_first_chars": FIRST_CHARS,
        "perplexity_first_512_tokens": round(perplexity(llm, ids[:512]), 4),
        "perplexity_first_1024_tokens": round(perplexity(llm, ids[:1024]), 4),
        "tokens": [
            {"text": s, "ids": llm.tokenize(s.encode(), add_bos=False, special=False)}
            for s in STRINGS
        ],
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps({k: v for k, v in result.items() if k != "tokens"}))


if __name__ == "__main__":
    main(*sys.argv[1:])
