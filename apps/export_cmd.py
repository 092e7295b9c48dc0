"""`specstream export-model`: write a GGUF model (default: SmolLM2) as an mlx-lm folder."""

from __future__ import annotations

from .args import model_name

HELP = "write the default (or a .gguf) model as an mlx-lm-loadable folder"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export-model", help=HELP, description=HELP)
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument(
        "--model",
        type=model_name,
        default=None,
        help="a .gguf file or qwen2.5-coder-0.5b-instruct (default: SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--dtype",
        choices=["stored", "float32", "float16", "bfloat16"],
        default="stored",
        help="stored: keep the GGUF quantization (default); otherwise dequantize",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from specstream_mlx import SpecstreamError
    from specstream_mlx.models.gguf import convert_gguf
    from specstream_mlx.models.packaged import MODELS, default_gguf_path, packaged_gguf

    from .args import output_folder

    if args.model is None:
        gguf = default_gguf_path()
    elif args.model in MODELS:
        gguf = packaged_gguf(args.model)
    else:
        gguf = Path(args.model)
        if gguf.is_dir():
            raise SpecstreamError(f"{gguf} is a folder: it can be loaded by mlx-lm as it is")
        if gguf.suffix != ".gguf":
            raise SpecstreamError(f"{gguf} is not a .gguf file")
    output_folder(args.out, "--out", args.overwrite)
    out = convert_gguf(gguf, args.out, overwrite=args.overwrite, dtype=args.dtype)
    print(f'wrote {out} (run it with: mlx_lm.generate --model {out} --prompt "Hello")')
    return 0
