"""A next-token LoRA folder merged into its base model, written as a transformers model folder
(float32 safetensors, config.json, tokenizer) that `ss.load(FOLDER)`, `specstream --model
FOLDER` and the PyTorch path's `--model FOLDER` read: a base on which lossless streams can be
trained (`python -m convert.torch_train --mode lossless --model FOLDER ...`), so that decoding
gives the LoRA's answers exactly (issue 20's probe, docs/BENCHMARKS.md "sql's two-stage
recipe").

    ./dev.sh python scripts/fuse_next_token.py LORA_FOLDER OUT [--model NAME] [--overwrite]

The LoRA goes on through PEFT as `convert.torch_train --init` puts it, then is merged; the folder
is built beside OUT and renamed into place."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("lora", help="a next-token LoRA folder (specstream train --mode next-token)")
    p.add_argument("out", help="the model folder to write (a new one)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT")
    p.add_argument("--model", default=None, help="its base model (default: the default model)")
    args = p.parse_args()
    from safetensors.torch import save_file
    from specstream_apps.args import output_folder

    from convert.adapter_format import next_token_settings
    from convert.torch_adapter import add_lora, start_from
    from convert.torch_base import load_base
    from convert.torch_streams import TorchStreams
    from specstream_mlx.errors import SpecstreamError
    from specstream_mlx.folders import staged_folder
    from specstream_mlx.streams.config import StreamConfig
    from specstream_mlx.streams.fingerprint import MERGED_LORA, weights_sha256

    out = Path(args.out)
    try:  # the LoRA's settings and OUT checked before the model loads
        rank, scale, blocks = next_token_settings(args.lora)
        output_folder(args.out, "OUT", args.overwrite)
        base = load_base(args.model)
        n = base.config["num_hidden_layers"]
        if blocks > n:
            raise SpecstreamError(
                f"{args.lora}: its LoRA covers {blocks} blocks, {base.name} has {n}"
            )
        cfg = StreamConfig(  # the LoRA's settings; the streams are only PEFT's scaffold
            mode="shared",
            gamma=1,
            n_msa_layers=1,
            lora_rank=rank,
            lora_scale=scale,
            lora_blocks=None if blocks in (-1, n) else tuple(range(n - blocks, n)),
        ).validate(n)
        add_lora(base, cfg)
        start_from(args.lora, base, TorchStreams(cfg, base.config["hidden_size"]))
        model = base.model.merge_and_unload()
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # a GGUF base: the weights written are float32
        config["torch_dtype"] = "float32"
        config[MERGED_LORA] = {"adapter": str(args.lora), "sha256": weights_sha256(args.lora)}
        rope = config.get("rope_parameters") or {}
        if "rope_theta" in rope:  # transformers 5 nests it; mlx-lm reads it at the top
            config["rope_theta"] = rope["rope_theta"]
        tied = bool(config.get("tie_word_embeddings"))
        weights = {
            k: v.detach().contiguous()
            for k, v in model.state_dict().items()
            if not (tied and k == "lm_head.weight")
        }
        with staged_folder(out, args.overwrite) as tmp:
            save_file(weights, str(tmp / "model.safetensors"))
            (tmp / "model.safetensors").chmod(0o644)  # safetensors writes it owner-only
            (tmp / "config.json").write_text(json.dumps(config, indent=1))
            base.tokenizer.save_pretrained(str(tmp))
    except (SpecstreamError, OSError) as exc:
        print(f"fuse_next_token: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}: {args.lora} merged into {base.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
