"""PyTorch adapter folders on a torch base: save the streams (and shared mode's PEFT LoRA), load
them back, checked against the base. MLX folders load too (converted in memory)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from specstream_mlx.errors import SpecstreamError
from specstream_mlx.streams.config import FORMAT_VERSION, StreamConfig, next_token_config

from .adapter_format import (
    LORA_MODULES,
    Folder,
    is_next_token_folder,
    mlx_to_torch,
    next_token_folder,
    peft_config,
    read_folder,
    read_next_token_lora,
    write_folder,
)
from .torch_base import TorchBase
from .torch_streams import TorchStreams


def lora_config(cfg: StreamConfig):
    """Shared mode's LoRA as PEFT builds it: every linear layer of every block (of the blocks
    `cfg.lora_blocks` names, when it does)."""
    from peft import LoraConfig

    blocks = {}
    if cfg.lora_blocks is not None:
        blocks = {"layers_to_transform": list(cfg.lora_blocks), "layers_pattern": "layers"}
    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_scale * cfg.lora_rank,
        lora_dropout=0.0,
        target_modules=list(LORA_MODULES),
        bias="none",
        task_type="CAUSAL_LM",
        **blocks,
    )


def add_lora(base: TorchBase, cfg: StreamConfig) -> None:
    """Wrap the base in PEFT LoRA layers (B = 0: the output is unchanged until trained)."""
    from peft import get_peft_model

    if hasattr(base.model, "peft_config"):
        raise SpecstreamError("the base already carries LoRA layers")
    base.model = get_peft_model(base.model, lora_config(cfg))


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def save_torch_adapter(
    folder: str | os.PathLike,
    streams: TorchStreams,
    base: TorchBase,
    extra: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a PyTorch adapter folder atomically (see adapter_format for the layout)."""
    cfg = streams.config
    tensors = {k: _numpy(v.float()) for k, v in streams.state_dict().items()}
    lora, peft = {}, None
    if cfg.mode == "shared":
        from peft import get_peft_model_state_dict

        if not hasattr(base.model, "peft_config"):
            raise SpecstreamError("a shared-mode adapter needs the base's PEFT LoRA layers")
        lora = {k: _numpy(v.float()) for k, v in get_peft_model_state_dict(base.model).items()}
        peft = peft_config(cfg, sorted(LORA_MODULES), base.name)
    config = {
        "format_version": FORMAT_VERSION,
        "stream_config": cfg.to_dict(),
        "base_model": {"name": base.name, "fingerprint": base.fingerprint()},
        "shapes": {k: list(v.shape) for k, v in {**tensors, **lora}.items()},
        **(extra or {}),
    }
    return write_folder(folder, Folder("torch", config, tensors, lora, peft), overwrite)


def save_next_token_lora(
    folder: str | os.PathLike,
    base: TorchBase,
    cfg: StreamConfig,
    extra: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the base's PEFT LoRA alone (the next-token baseline, `--mode next-token`) as the MLX
    trainer writes it: an mlx-lm adapter folder that `specstream bench --lora`, `mlx_lm` and
    `convert.torch_train --init` read. `cfg` holds the LoRA's rank, scale and blocks."""
    from peft import get_peft_model_state_dict

    n_layers = base.config["num_hidden_layers"]
    lora = {k: _numpy(v.float()) for k, v in get_peft_model_state_dict(base.model).items()}
    blocks = n_layers if cfg.lora_blocks is None else len(cfg.lora_blocks)
    base_model = {"name": base.name, "fingerprint": base.fingerprint()}
    config = next_token_config(blocks, cfg.lora_rank, cfg.lora_scale, base_model)
    return write_folder(folder, next_token_folder({**config, **(extra or {})}, lora), overwrite)


def load_torch_adapter(folder: str | os.PathLike, base: TorchBase) -> TorchStreams:
    """Read a PyTorch (or MLX) adapter folder for `base`: its streams, and in shared mode its
    LoRA put on the base through PEFT. One error lists every mismatch."""
    src = _read_for(folder, base)
    cfg = src.stream_config.validate(base.config["num_hidden_layers"])
    streams = TorchStreams(cfg, base.config["hidden_size"])
    expected = {k: tuple(v.shape) for k, v in streams.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in src.tensors.items()}
    if cfg.mode == "shared":
        expected.update(expected_lora(base, cfg.lora_rank, cfg.lora_blocks))
        have.update({k: tuple(v.shape) for k, v in src.lora.items()})
    problems = shape_mismatches(expected, have)
    if problems:
        raise SpecstreamError(f"adapter {folder} does not fit: " + "; ".join(problems))
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in src.tensors.items()}
    streams.load_state_dict(state)
    streams.to(base.device, dtype=next(base.model.parameters()).dtype)  # float16 bases too
    if cfg.mode == "shared":
        _put_lora(base, src)
    else:
        remove_lora(base)
    return streams


def shape_mismatches(expected: dict, have: dict) -> list[str]:
    """Every tensor missing, unexpected or misshapen in `have` (name -> shape) against
    `expected`."""
    problems = [f"missing tensor {k} {list(s)}" for k, s in expected.items() if k not in have]
    problems += [f"unexpected tensor {k}" for k in have if k not in expected]
    problems += [
        f"{k}: shape {list(have[k])}, expected {list(s)}"
        for k, s in expected.items()
        if k in have and have[k] != s
    ]
    return problems


def _read_for(folder: str | os.PathLike, base: TorchBase) -> Folder:
    """A PyTorch or MLX adapter folder (the MLX one converted in memory), checked to be made for
    `base`."""
    src = read_folder(folder)
    if src.kind == "mlx":
        src, _ = mlx_to_torch(src)
    _check_base(src.config, base, folder)
    return src


def _check_base(config: dict, base: TorchBase, folder: str | os.PathLike) -> None:
    theirs = config.get("base_model", {}).get("fingerprint", {})
    ours = base.fingerprint()
    problems = [
        f"base {k}: adapter has {theirs.get(k)!r}, model has {ours[k]!r}"
        for k in ours
        if theirs.get(k) != ours[k]
    ]
    if problems:
        raise SpecstreamError(f"adapter {folder} was made for another base: " + "; ".join(problems))


def start_from(folder: str | os.PathLike, base: TorchBase, streams: TorchStreams) -> dict | None:
    """Training that continues an adapter: its streams' weights into `streams`, and in shared
    mode its LoRA into the base's trainable PEFT layers (add_lora first). The adapter must have
    the same stream settings and tensors; one error lists what differs. Returns the adapter's
    own training record (None if it has none), so the new one can keep its history. A
    next-token LoRA folder (no streams) gives shared mode its LoRA alone: `_lora_from`."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    if is_next_token_folder(folder):
        return _lora_from(folder, base, streams)
    src = _read_for(folder, base)
    theirs, ours = src.stream_config.to_dict(), streams.config.to_dict()
    drafting = ("top_k", "max_tree_nodes", "prune_threshold")  # how it drafts, not weights
    problems = [f"{k}: adapter has {_shown(theirs.get(k))}, this run {_shown(v)}"
                for k, v in ours.items() if theirs.get(k) != v and k not in drafting]  # fmt: skip
    expected = {k: tuple(v.shape) for k, v in streams.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in src.tensors.items()}
    if streams.config.mode == "shared":
        expected.update(
            {k: tuple(v.shape) for k, v in get_peft_model_state_dict(base.model).items()}
        )
        have.update({k: tuple(v.shape) for k, v in src.lora.items()})
    problems += shape_mismatches(expected, have)
    if problems:
        raise SpecstreamError(f"cannot continue {folder}: " + "; ".join(problems))
    device = next(streams.parameters()).device

    def tensor(v) -> torch.Tensor:
        return torch.from_numpy(np.array(v, dtype=np.float32)).to(device)

    streams.load_state_dict({k: tensor(v) for k, v in src.tensors.items()})
    if streams.config.mode == "shared":
        set_peft_model_state_dict(base.model, {k: tensor(v) for k, v in src.lora.items()})
    return src.config.get("training")


def _shown(value) -> str:
    """A setting as an error shows it: a long list (a draft vocabulary) by its length."""
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"{len(value):,} entries"
    return repr(value)


def _lora_from(folder: str | os.PathLike, base: TorchBase, streams: TorchStreams) -> dict | None:
    """Shared-mode training that starts from a next-token LoRA (`specstream train --mode
    next-token`, such as a writing tool's same-budget baseline): its LoRA into the base's PEFT
    layers, the streams as initialised. Same rank, scale and blocks, or one error lists what
    differs."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    cfg = streams.config
    if cfg.mode != "shared":
        raise SpecstreamError(
            f"{folder} is a LoRA without streams: only --mode shared can start from one"
        )
    config, lora = read_next_token_lora(folder)
    _check_base(config, base, folder)
    params = config.get("lora_parameters")
    params = params if isinstance(params, dict) else {}
    rank, scale = params.get("rank"), params.get("scale")
    problems = [f"lora {name}: adapter has {theirs!r}, this run {ours!r}"
                for name, theirs, ours in (("rank", rank, cfg.lora_rank),
                                           ("scale", scale, cfg.lora_scale))
                if theirs != ours]  # fmt: skip
    n, covers = base.config["num_hidden_layers"], config.get("num_layers")
    theirs = n if covers in (-1, None) else covers
    ours = n if cfg.lora_blocks is None else len(cfg.lora_blocks)
    if theirs != ours:  # one line instead of a tensor list
        problems.append(f"its LoRA covers the top {theirs} blocks, this run {ours} (--lora-layers)")
    if not problems:  # the settings agree: the tensors must fit them
        expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(base.model).items()}
        problems += shape_mismatches(expected, {k: tuple(v.shape) for k, v in lora.items()})
    if problems:
        raise SpecstreamError(f"cannot start from {folder}: " + "; ".join(problems[:30]))
    device = next(streams.parameters()).device
    set_peft_model_state_dict(
        base.model,
        {k: torch.from_numpy(np.array(v, dtype=np.float32)).to(device) for k, v in lora.items()},
    )
    return config.get("training")


def expected_lora(
    base: TorchBase, rank: int, blocks: tuple[int, ...] | None = None
) -> dict[str, tuple[int, int]]:
    """PEFT tensor name -> shape of shared mode's LoRA on every linear layer of every block (of
    `blocks` alone when given: an adapter's lora_blocks, what its file holds)."""
    lm = base.model.get_base_model() if hasattr(base.model, "peft_config") else base.model
    out = {}
    for i, layer in enumerate(lm.model.layers):
        if blocks is not None and i not in blocks:
            continue
        for path in LORA_MODULES.values():
            linear = layer.get_submodule(path)
            linear = getattr(linear, "base_layer", linear)  # already wrapped by PEFT
            key = f"base_model.model.model.layers.{i}.{path}"
            out[f"{key}.lora_A.weight"] = (rank, linear.in_features)
            out[f"{key}.lora_B.weight"] = (linear.out_features, rank)
    return out


def remove_lora(base: TorchBase) -> None:
    """Take PEFT's LoRA layers off: the base as loaded (a merged LoRA's weights restored
    exactly, not subtracted again)."""
    if hasattr(base.model, "peft_config"):
        unmerged = base.unmerged or {}
        for name, layer in _lora_layers(base.model):
            if name in unmerged:
                layer.get_base_layer().weight.data.copy_(unmerged[name])
                layer.merged_adapters.clear()
        base.unmerged = None
        base.model = base.model.unload()


def _lora_layers(model) -> list:
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def _merge_lora(base: TorchBase) -> None:
    """Fold the LoRA into the weights it wraps, for decoding, as the MLX runtime does: PEFT's
    unmerged LoRA adds two small kernels per projection, which made a pass twice as dear on a
    GPU with LoRA in every block (docs/BENCHMARKS.md, "The fifth lease"). The weights as loaded
    are kept for remove_lora."""
    base.unmerged = {
        n: layer.get_base_layer().weight.detach().clone() for n, layer in _lora_layers(base.model)
    }
    base.model.merge_adapter()


def _put_lora(base: TorchBase, src: Folder) -> None:
    """The adapter's LoRA on the base through PEFT, in the blocks whose LoRA does anything: an
    adapter trained with LoRA in its top blocks only (`--lora-layers`) has zero (or no) LoRA in
    the others, where PEFT would add exact zeros at the cost of two kernels per projection
    (~50% a token on a GPU)."""
    from peft import PeftModel

    remove_lora(base)
    lora, peft = src.lora, src.peft_config
    active = _blocks_with_lora(lora)
    if active and active != set(range(base.config["num_hidden_layers"])):
        lora = {k: v for k, v in lora.items() if _block(k) in active}
        peft = {**peft, "layers_to_transform": sorted(active), "layers_pattern": "layers"}
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(Path(tmp) / "a", Folder("torch", src.config, {}, lora, peft))
        try:
            base.model = PeftModel.from_pretrained(base.model, str(Path(tmp) / "a"))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise SpecstreamError(f"cannot load the adapter's LoRA: {exc}") from None
    base.model.eval()
    _merge_lora(base)


def _block(name: str) -> int:
    """The block index in a PEFT LoRA tensor name (...model.layers.<i>....)."""
    return int(name.split(".layers.", 1)[1].split(".", 1)[0])


def _blocks_with_lora(lora: dict) -> set[int]:
    """Blocks with a nonzero LoRA B."""
    return {_block(k) for k, v in lora.items() if ".lora_B." in k and np.any(np.asarray(v))}
