"""MLX vs the PyTorch path on the default model: weights, logits (against a float64 reference of
the same weights), one tree step's main and stream logits, and greedy speculative decoding with
the shipped adapters (tokens, tau, time per token on this machine). Prints one JSON object.

    ./dev.sh python benchmarks/torch_parity.py [--adapters chat,summarize] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# isort: off
import specstream_mlx as ss  # first: loads OpenBLAS before mlx is imported
import mlx.core as mx  # noqa: E402  (after specstream_mlx on purpose)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

# isort: on
from specstream_convert.parity import max_diff, one_tree_step
from specstream_convert.torch_adapter import load_torch_adapter
from specstream_convert.torch_adapter import remove_lora as remove_torch_lora
from specstream_convert.torch_base import load_base
from specstream_convert.torch_streams import (
    speculative_decode,
)

from specstream_mlx.decoding.loop import Decoder, decode
from specstream_mlx.decoding.policy import TreePolicy
from specstream_mlx.decoding.tree import draft_tree
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.arch import arch_of
from specstream_mlx.provenance import provenance
from specstream_mlx.streams.adapter_io import SHIPPED_DIR, load_adapter
from specstream_mlx.streams.lora import remove_lora

PROMPT = (
    "Summarize in two sentences: The Eiffel Tower is a wrought-iron lattice tower on the Champ "
    "de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company "
    "designed and built the tower from 1887 to 1889."
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--adapters", default="chat,summarize")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    torch.set_num_threads(2)
    loaded, base = ss.load(), load_base()
    ours = dict(tree_flatten(loaded.model.parameters()))
    theirs = base.model.state_dict()
    identical = all(np.array_equal(np.array(v), theirs[k].numpy()) for k, v in ours.items())
    ids = encode_prompt(loaded, "What is the capital of France?")
    m = np.array(loaded.model(mx.array(ids)[None])[0])
    with torch.inference_mode():
        t = base.model(torch.tensor([ids])).logits[0].numpy()
        exact = load_base(dtype="float64").model(torch.tensor([ids])).logits[0].numpy()
    report = {
        "weights_bit_identical": identical,
        "full_forward": {
            "positions": len(ids),
            "max_abs_logit": round(float(np.abs(exact).max()), 3),
            "mlx_vs_torch": max_diff(m, t),
            "mlx_vs_float64": max_diff(m, exact),
            "torch_vs_float64": max_diff(t, exact),
            "argmax_equal": bool((m.argmax(-1) == t.argmax(-1)).all()),
        },
        "adapters": {},
    }
    prompt = encode_prompt(loaded, PROMPT)
    for name in args.adapters.split(","):
        params = load_adapter(name, loaded)
        streams = load_torch_adapter(Path(SHIPPED_DIR) / name, base)
        tree = draft_tree(prompt[-1], [[504, 1030], [3575, 28]])
        out, survivors, main, stream = one_tree_step(loaded, params, base, streams, prompt, tree)
        arch = arch_of(loaded.model, loaded.config["model_type"])
        start = time.perf_counter()
        dec = Decoder(loaded.model, arch, params, TreePolicy.of(params.config))
        m_steps = list(decode(dec, prompt, args.max_tokens))
        mlx_s = time.perf_counter() - start
        start = time.perf_counter()
        t_steps = list(speculative_decode(base.model, streams, prompt, args.max_tokens))
        torch_s = time.perf_counter() - start
        report["adapters"][name] = {
            "mode": params.config.mode,
            "tree_step_main_logits": max_diff(out.main_logits, main),
            "tree_step_stream_logits": max_diff(out.stream_logits, stream),
            "same_survivors": out.survivors == survivors,
            "tokens_identical": [s.tokens for s in m_steps] == [s.tokens for s in t_steps],
            "tau_mlx": round(args.max_tokens / len(m_steps), 3),
            "tau_torch": round(args.max_tokens / len(t_steps), 3),
            "ms_per_token_mlx": round(1000 * mlx_s / args.max_tokens, 1),
            "ms_per_token_torch_cpu": round(1000 * torch_s / args.max_tokens, 1),
        }
        remove_lora(loaded.model)
        remove_torch_lora(base)
    print(json.dumps({**report, **provenance()}, indent=1))


if __name__ == "__main__":
    main()
