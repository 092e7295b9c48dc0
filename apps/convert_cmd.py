"""`specstream convert`: a PyTorch adapter folder (streams + PEFT LoRA) to an MLX one, or back.

The direction follows the source folder. Before anything is written the result is checked
against the target base model (its fingerprint, and every tensor's name and shape); the output
folder is written atomically, with the source's acceptance.json and README.md (its card: the
training data's licences travel with it). Needs neither torch nor PEFT.
"""

from __future__ import annotations

from .args import model_name

HELP = "convert a stream adapter between the PyTorch (PEFT) and MLX formats"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help=HELP, description=HELP)
    p.add_argument("--from", dest="source", required=True, help="adapter folder to convert")
    p.add_argument("--to", dest="target", required=True, help="output folder (written atomically)")
    p.add_argument(
        "--model",
        type=model_name,
        default=None,
        help="the base model to check against (default: the one the adapter names)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument(
        "--lora-dtype",
        choices=["float32", "float16"],
        default=None,
        help="store a shared adapter's LoRA tensors in this dtype (default: as they are); "
        "float16 halves a writing tool's file",
    )
    p.add_argument(
        "--heads-dtype",
        choices=["float32", "float16"],
        default=None,
        help="store the streams' parent heads in this dtype (default: as they are); float16 "
        "halves them, and changes no token a lossless decoder gives",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="convert without loading the base model (names and shapes are not checked)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from specstream_convert import adapter_format as af

    from specstream_mlx import SpecstreamError

    from .args import output_folder

    source = Path(args.source)
    if not source.exists():  # a shipped adapter's name ("chat", "sql", ...)
        from specstream_mlx.streams.adapter_io import resolve_adapter

        source = resolve_adapter(args.source)
    src = af.read_folder(source)
    target = Path(args.target).resolve()
    if target == source.resolve() or target in source.resolve().parents:
        raise SpecstreamError("--to must differ from --from and not hold it")
    output_folder(args.target, "--to", args.overwrite)
    cfg = src.stream_config
    if src.kind == "torch":
        out, origin = af.torch_to_mlx(src)
        mlx_side = out
    else:
        out, origin = af.mlx_to_torch(src)
        mlx_side, origin = src, {}
    if args.lora_dtype is not None:
        out = af.lora_as(out, args.lora_dtype)
    if args.heads_dtype is not None:
        out = af.heads_as(out, args.heads_dtype)
    checked = "not checked (--no-check)"
    loaded = None
    if not args.no_check:
        loaded = _base(args.model, src)
        fingerprint, expected = _expected(loaded, cfg)
        af.check_against(mlx_side, fingerprint, expected, origin)
        checked = f"checked against {loaded.name}"
        if "base_model" in out.config:  # the base it fits, not the trainer's path to its file
            out.config["base_model"]["name"] = loaded.name
    check = None
    if loaded is not None and out.kind == "mlx":
        from specstream_mlx.streams.adapter_io import read_adapter

        def check(tmp):  # the runtime itself must accept it before it takes the name
            try:
                read_adapter(tmp, loaded)
            except SpecstreamError as exc:  # named as the folder it would have been
                raise SpecstreamError(str(exc).replace(str(tmp), str(args.target))) from None

    written = af.write_folder(args.target, out, overwrite=args.overwrite, check=check)
    n = len(out.tensors) + len(out.lora)
    carried = "".join(f", {name} carried" for name in sorted(out.companions))
    print(
        f"wrote {written}: {src.kind} -> {out.kind}, {cfg.mode} mode, {n} tensors, {checked}"
        f"{carried}"
    )
    return 0


def _base(name, src):
    from specstream_mlx import SpecstreamError, load_model

    name = name or src.config.get("base_model", {}).get("name")
    try:
        return load_model(name)
    except SpecstreamError as exc:
        raise SpecstreamError(
            f"cannot load the base model to check against ({exc}); name it with --model, "
            "or pass --no-check"
        ) from None


def _expected(loaded, cfg):
    """The target base's fingerprint, and MLX tensor name -> shape of an adapter with `cfg`."""
    from mlx.utils import tree_flatten

    from specstream_mlx.streams.adapter_io import base_fingerprint
    from specstream_mlx.streams.lora import expected_lora_shapes
    from specstream_mlx.streams.params import StreamParams

    cfg.validate(loaded.config["num_hidden_layers"])
    params = StreamParams(cfg, loaded.config["hidden_size"])
    expected = {k: tuple(v.shape) for k, v in tree_flatten(params.parameters())}
    if cfg.mode == "shared":
        expected.update(expected_lora_shapes(loaded.model, cfg.lora_rank, cfg.lora_blocks))
    return base_fingerprint(loaded), expected
