"""Adapter folders: `adapters.safetensors` + `adapter_config.json` (StreamConfig, the base
model's fingerprint, tensor shapes). Loading validates everything and reports every problem at
once, as mlx-lm's `load_adapters` does."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import SpecstreamError
from ..folders import staged_folder
from .acceptance import ACCEPTANCE_FILE, Acceptance
from .config import (
    FORMAT_VERSION,
    StreamConfig,
    next_token_config,
    next_token_settings,
    saved_stream_config,
)
from .fingerprint import MERGED_LORA, fingerprint, weights_sha256
from .lora import (
    PREFIX,
    Fused,
    apply_lora,
    blocks_in_use,
    can_fuse,
    current_lora,
    expected_lora_shapes,
    fuse_lora,
    load_lora_weights,
    lora_block,
    lora_settings,
    lora_weights,
    put_back_lora,
    remove_lora,
    stored_blocks,
    unfuse_lora,
)
from .params import StreamParams

WEIGHTS, CONFIG = "adapters.safetensors", "adapter_config.json"
# Adapters shipped in the package: the default model's at the top, another packaged model's in a
# subfolder named after it (adapters/qwen2.5-coder-0.5b-instruct/chat).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "adapters"


def base_fingerprint(loaded) -> dict:
    """What an adapter must match: the architecture, and the tokenizer's vocabulary (hashed
    once per loaded model: ~0.1 s for a 49k vocabulary)."""
    if loaded.fingerprint is None:
        loaded.fingerprint = fingerprint(loaded.config, loaded.tokenizer.get_vocab())
    return dict(loaded.fingerprint)


def save_adapter(
    folder: str | os.PathLike,
    params: StreamParams,
    loaded,
    extra: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an adapter folder atomically (built beside the target, then renamed). A shared-mode
    adapter also holds the LoRA tensors of `loaded.model`."""
    lora, config = {}, params.config
    if params.config.mode == "shared":
        want = {(params.config.lora_rank, params.config.lora_scale)}
        if lora_settings(loaded.model) != want:
            raise SpecstreamError(
                f"a shared-mode adapter needs LoRA layers {want} on the model; it has "
                f"{lora_settings(loaded.model) or 'none'}"
            )
        lora, config = _stored_lora(lora_weights(loaded.model), params.config)
    return _save(folder, params, config, lora, loaded, extra, overwrite)


def _save(folder, params, stream_config, lora: dict, loaded, extra, overwrite: bool) -> Path:
    """Write `params`'s tensors and `lora`'s (shared mode) under `stream_config`."""
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise SpecstreamError(f"adapter folder exists: {folder} (pass --overwrite to replace it)")
    weights = {**dict(tree_flatten(params.parameters())), **lora}
    config = {
        "format_version": FORMAT_VERSION,
        "stream_config": stream_config.to_dict(),
        "base_model": _base_record(loaded),
        "shapes": {name: list(w.shape) for name, w in weights.items()},
        **(extra or {}),
    }
    more = {}
    if params.acceptance is not None:  # measured acceptance: the device picks the tree
        more[ACCEPTANCE_FILE] = params.acceptance.to_dict()
    write_folder(folder, weights, config, more=more)
    return folder


def _base_record(loaded) -> dict:
    """The base an adapter is saved for: its name, fingerprint and, for a merged model
    (scripts/fuse_next_token.py), the LoRA merged into it."""
    merged = {MERGED_LORA: loaded.config[MERGED_LORA]} if MERGED_LORA in loaded.config else {}
    return {"name": loaded.name, "fingerprint": base_fingerprint(loaded), **merged}


def _stored_lora(lora: dict, config: StreamConfig) -> tuple[dict, StreamConfig]:
    """The LoRA tensors a file holds: those of the blocks where b is nonzero (an adapter trained
    with LoRA in its top blocks only stores nothing below them), named in `lora_blocks`."""
    used, every = blocks_in_use(lora), {lora_block(k) for k in lora}
    if not used or used == every:
        return lora, replace(config, lora_blocks=None)
    kept = {k: v for k, v in lora.items() if lora_block(k) in used}
    return kept, replace(config, lora_blocks=tuple(sorted(used)))


def pack_lora_streams(
    lora_folder: str | os.PathLike,
    streams_folder: str | os.PathLike,
    out: str | os.PathLike,
    loaded,
    overwrite: bool = False,
) -> Path:
    """A shared-mode adapter whose main stream ignores its streams (main_reads_streams false),
    from a next-token LoRA folder and a lossless adapter trained on that LoRA merged into the
    base (scripts/fuse_next_token.py): decoding gives the LoRA's answers exactly, and the
    streams draft as they did on the merged model (on every row the fused LoRA is the same
    weights). Both are read against `loaded`, the untouched base; streams whose base folder says
    it merged another LoRA (fuse_next_token.py records the LoRA's sha256) are refused. OUT
    records both sources' training (their data's licences included) and keeps the streams'
    acceptance.json."""
    lora, streams = read_adapter(lora_folder, loaded), read_adapter(streams_folder, loaded)
    if lora.streams is not None or not lora.lora:
        raise SpecstreamError(f"{lora_folder}: not a next-token LoRA folder (mlx-lm's format)")
    if streams.streams is None or streams.streams.config.mode != "lossless":
        raise SpecstreamError(f"{streams_folder}: not a lossless stream adapter")
    _check_merged_from(lora_folder, streams_folder, loaded)
    used, n_layers = blocks_in_use(lora.lora), loaded.config["num_hidden_layers"]
    if not used:
        raise SpecstreamError(f"{lora_folder}: its LoRA is zero (untrained)")
    config = replace(
        streams.streams.config,
        mode="shared",
        main_reads_streams=False,
        prompt_streams=False,
        shared_stream_adapters=True,
        lora_rank=lora.lora_rank,
        lora_scale=lora.lora_scale,
        lora_blocks=None if len(used) == n_layers else tuple(sorted(used)),
    ).validate(n_layers)
    records = {}
    for name, folder in (("lora", lora_folder), ("streams", streams_folder)):
        records[name] = json.loads((resolve_adapter(folder, loaded) / CONFIG).read_text())
    extra = {
        "training": {k: {"adapter": str(f), "training": records[k].get("training")}
                     for k, f in (("lora", lora_folder), ("streams", streams_folder))},
        **{k: v for k, v in records["streams"].items() if k == "draft_vocab_from"},
    }  # fmt: skip
    weights = {k: v for k, v in lora.lora.items() if lora_block(k) in used}
    return _save(out, streams.streams, config, weights, loaded, extra, overwrite)


def main_ignoring_streams(
    folder: str | os.PathLike, out: str | os.PathLike, loaded, overwrite: bool = False
) -> Path:
    """A copy of shared-mode adapter `folder` whose main stream ignores its streams
    (main_reads_streams false, so prompt_streams false too): plain decoding runs its LoRA
    without stream rows and `ss` stays exact against it. Its answers become its LoRA's alone,
    not those it was trained to give beside its streams: they move a little (measure them).
    Files are copied unchanged except the config, which records the source folder and its
    weights' sha256 (`main_ignores_streams_of`); acceptance.json is kept, to be measured again
    (`specstream calibrate --measure-acceptance --overwrite`)."""
    adapter = read_adapter(folder, loaded)
    if adapter.streams is None or not adapter.streams.config.main_needs_streams:
        raise SpecstreamError(
            f"{folder}: not a shared-mode adapter whose main stream reads its streams"
        )
    source = resolve_adapter(folder, loaded)
    config = json.loads((source / CONFIG).read_text())
    stream_config = replace(adapter.streams.config, main_reads_streams=False, prompt_streams=False)
    config["stream_config"] = stream_config.validate(loaded.config["num_hidden_layers"]).to_dict()
    config["main_ignores_streams_of"] = {"adapter": str(folder), "sha256": weights_sha256(source)}
    with staged_folder(out, overwrite) as tmp:
        for path in source.iterdir():
            if path.is_file() and path.name != CONFIG:
                shutil.copy2(path, tmp / path.name)
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return Path(out)


def _check_merged_from(lora_folder, streams_folder, loaded) -> None:
    """Refuse streams trained on a merged model (scripts/fuse_next_token.py) of another LoRA
    than `lora_folder`, as their base record says (adapters saved since it holds the merge) or
    else the folder it names, where that folder is still here to tell."""
    record = json.loads((resolve_adapter(streams_folder, loaded) / CONFIG).read_text())
    base = record.get("base_model", {})
    trained_on, merged = base.get("name"), base.get(MERGED_LORA)
    if merged is None and isinstance(trained_on, str) and trained_on:
        try:
            merged = json.loads((Path(trained_on) / "config.json").read_text()).get(MERGED_LORA)
        except (OSError, ValueError, AttributeError):
            return
    if isinstance(merged, dict) and merged.get("sha256") != weights_sha256(
        resolve_adapter(lora_folder, loaded)
    ):
        raise SpecstreamError(
            f"{streams_folder} was trained on {trained_on}, the merge of another LoRA "
            f"({merged.get('adapter')}), not of {lora_folder}"
        )


def save_lora_adapter(
    folder: str | os.PathLike, loaded, extra: dict | None = None, overwrite: bool = False
) -> Path:
    """Write the LoRA layers of `loaded.model` alone (the next-token baseline) as an mlx-lm
    adapter folder: `mlx_lm.generate --adapter-path` reads it as well as `load_adapter`."""
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise SpecstreamError(f"adapter folder exists: {folder} (pass --overwrite to replace it)")
    settings = lora_settings(loaded.model)
    if len(settings) != 1:
        raise SpecstreamError(f"the model needs one kind of LoRA layers, it has {settings or 0}")
    (rank, scale), prefix = settings.pop(), len(PREFIX)
    lora, n_layers = lora_weights(loaded.model), loaded.config["num_hidden_layers"]
    lowest = _lowest_trained_block(lora)
    weights = {k[prefix:]: v for k, v in lora.items() if lora_block(k) >= lowest}
    base = {"name": loaded.name, "fingerprint": base_fingerprint(loaded)}
    config = next_token_config(n_layers - lowest, rank, scale, base)
    write_folder(folder, weights, {**config, **(extra or {})})
    return folder


def _lowest_trained_block(lora: dict) -> int:
    """The lowest block whose LoRA b is nonzero: mlx-lm's folder holds the top blocks from there
    (LoRA trained in the top blocks only stores none below them; untrained LoRA keeps them all)."""
    used = blocks_in_use(lora)
    return min(used) if used else 0


def write_folder(
    folder: Path,
    weights: dict,
    config: dict,
    weights_name: str = WEIGHTS,
    config_name: str = CONFIG,
    more: dict[str, dict] | None = None,
) -> None:
    """Build the folder (one safetensors file, one JSON file, and the JSON files in `more`)
    beside its target, then rename it into place: a reader sees the old folder or the new one,
    never half of one."""
    bad = non_finite(weights)
    if bad:  # never replace a folder with weights no reader accepts
        raise SpecstreamError(
            f"not writing {folder}: NaN or infinite values in {len(bad)} tensors "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); training diverged "
            "(a lower --lr may help)"
        )
    with staged_folder(folder, overwrite=True) as tmp:  # the callers decide on overwriting
        mx.save_safetensors(str(tmp / weights_name), weights)
        (tmp / config_name).write_text(json.dumps(config, indent=2) + "\n")
        for name, data in (more or {}).items():
            (tmp / name).write_text(json.dumps(data, indent=1) + "\n")


def shipped_adapters(loaded=None) -> list[str]:
    """Names of the adapters shipped inside the package: the default model's, or (given
    `loaded`) those made for that model."""
    if loaded is None:
        return [p.name for p in _shipped_folders() if p.parent == SHIPPED_DIR]
    return sorted({p.name for p in _shipped_folders() if _fits(p, loaded)})


def _shipped_folders() -> list[Path]:
    """Every shipped adapter folder: the default model's (adapters/NAME) first, then other
    models' (adapters/MODEL/NAME)."""
    if not SHIPPED_DIR.is_dir():
        return []
    places = sorted(SHIPPED_DIR.iterdir())
    own = [p for p in places if (p / CONFIG).is_file()]
    models = [d for d in places if d.is_dir() and d not in own]
    return own + [p for d in models for p in sorted(d.iterdir()) if (p / CONFIG).is_file()]


def made_for(name: str | os.PathLike, loaded) -> bool:
    """Whether the adapter's config names `loaded`'s base (fingerprint), without reading its
    tensors."""
    try:
        return _fits(resolve_adapter(name, loaded), loaded)
    except SpecstreamError:
        return False


def _fits(folder: Path, loaded) -> bool:
    try:
        config = json.loads((folder / CONFIG).read_text())
        return config["base_model"]["fingerprint"] == base_fingerprint(loaded)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def resolve_adapter(name: str | os.PathLike, loaded=None) -> Path:
    """A folder path, or the name of a shipped adapter (e.g. "chat"): the one made for `loaded`
    where several models ship one of that name, else the default model's. A folder that happens
    to carry a shipped name (an `sql/` in the working directory) wins only if it is an adapter
    folder."""
    path = Path(name).expanduser()
    shipped = [p for p in _shipped_folders() if p.name == str(name)]
    if path.exists() and ((path / CONFIG).is_file() or not shipped):
        return path
    if shipped:
        fitting = [p for p in shipped if loaded is not None and _fits(p, loaded)]
        return (fitting or shipped)[0]
    names = sorted({p.name for p in _shipped_folders()})
    raise SpecstreamError(
        f"adapter {str(name)!r} not found: no such folder, and not a shipped "
        f"adapter (shipped: {', '.join(names) or 'none'})"
    )


def origin(name: str | os.PathLike, loaded=None) -> str:
    """ "shipped" for an adapter inside the package, else its folder (absolute)."""
    folder = resolve_adapter(name, loaded).resolve()
    return "shipped" if folder.is_relative_to(SHIPPED_DIR.resolve()) else str(folder)


@dataclass
class Adapter:
    """An adapter folder read and checked against one base model, not yet on it: its streams
    (None for an mlx-lm LoRA folder) and, for shared mode and LoRA folders, its LoRA tensors."""

    source: str  # the folder or shipped name it was read from
    streams: StreamParams | None
    lora: dict[str, mx.array] = field(default_factory=dict)  # PREFIX + parameter path
    lora_rank: int = 0
    lora_scale: float = 0.0

    @property
    def nbytes(self) -> int:
        """Memory of its tensors."""
        own = (
            [] if self.streams is None else [v for _, v in tree_flatten(self.streams.parameters())]
        )
        return sum(v.nbytes for v in own + list(self.lora.values()))


def read_adapter(folder: str | os.PathLike, loaded) -> Adapter:
    """Read an adapter folder (or shipped adapter name) for `loaded` without changing the model;
    one SpecstreamError lists every mismatch."""
    source = str(folder)
    folder = resolve_adapter(folder, loaded)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise SpecstreamError(f"not an adapter folder (needs {CONFIG} and {WEIGHTS}): {folder}")
    try:
        config = json.loads((folder / CONFIG).read_text())
    except ValueError as exc:
        raise SpecstreamError(f"unreadable {folder / CONFIG}: {exc}") from None
    if not isinstance(config, dict):
        raise SpecstreamError(f"unreadable {folder / CONFIG}: not a JSON object")
    if "stream_config" not in config:
        if config.get("fine_tune_type") == "lora":
            return _read_lora_adapter(source, folder, config, loaded)
        raise SpecstreamError(
            f"unreadable {folder / CONFIG}: no stream_config (neither a specstream adapter nor "
            "an mlx-lm LoRA folder)"
        )
    stream_config = saved_stream_config(config, folder / CONFIG)  # the layer count below
    _check_base(folder, config, loaded)
    try:
        stream_config.validate(loaded.config["num_hidden_layers"])
    except SpecstreamError as exc:
        raise SpecstreamError(f"unreadable {folder / CONFIG}: {exc}") from None
    vocab = stream_config.draft_vocab
    if vocab and vocab[-1] >= loaded.config["vocab_size"]:
        raise SpecstreamError(
            f"adapter {folder}: its draft_vocab names token {vocab[-1]}, the model has "
            f"{loaded.config['vocab_size']}"
        )
    weights = _read_weights(folder)
    params = StreamParams(stream_config, loaded.config["hidden_size"])
    expected = {name: tuple(w.shape) for name, w in tree_flatten(params.parameters())}
    shared = stream_config.mode == "shared"
    lora_names: set[str] = set()
    if shared:
        stored = expected_lora_shapes(
            loaded.model, stream_config.lora_rank, stream_config.lora_blocks
        )
        lora_names = set(stored)
        expected.update(stored)
    problems = _misfits(expected, weights)
    if problems:
        raise SpecstreamError(f"adapter {folder} does not fit: " + "; ".join(problems))
    weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    params.update(tree_unflatten([(k, v) for k, v in weights.items() if k not in lora_names]))
    lora = {k: weights[k] for k in lora_names}  # the blocks it names; the others have none
    mx.eval(params.parameters(), lora)
    params.acceptance = _acceptance(folder, stream_config)
    if not shared:
        return Adapter(source, params)
    return Adapter(source, params, lora, stream_config.lora_rank, stream_config.lora_scale)


def attach(adapter: Adapter | None, loaded, reuse: Fused | None = None) -> Fused | None:
    """Put `adapter`'s LoRA on `loaded.model` (None, or a lossless adapter: the base weights).
    LoRA on a float base is fused into its weights, computed afresh from the untouched base
    (base speed, no drift), or put back as `reuse` holds them: what an earlier attach of the
    same adapter returned; on a quantized base it stays unfused (mlx-lm LoRALinear layers on
    the blocks it covers, whose tensors are swapped). Compiled passes of the old weights are
    dropped. The streams are the caller's to set (`ss.use_adapter`, `AdapterManager`'s
    sessions). Returns the fused weights (None: nothing fused)."""
    model = loaded.model
    unfuse_lora(model, loaded.fused)
    loaded.fused = None
    loaded.passes.clear()  # traces hold the weights they were traced with
    if current_lora(model) is not None:
        remove_lora(model, keep=True)
    if adapter is not None and adapter.lora:
        if can_fuse(model, adapter.lora):
            loaded.fused = fuse_lora(model, adapter.lora, adapter.lora_scale, reuse)
        else:
            blocks = stored_blocks(adapter.lora)
            if not put_back_lora(model, adapter.lora_rank, adapter.lora_scale, blocks):
                apply_lora(model, adapter.lora_rank, adapter.lora_scale, blocks)
            load_lora_weights(model, adapter.lora)
    return loaded.fused


def load_adapter(folder: str | os.PathLike, loaded) -> StreamParams | None:
    """Read an adapter folder (or shipped adapter name) for `loaded` and put it on the model: a
    shared-mode adapter puts its LoRA on `loaded.model` (fused into a float base, see `attach`;
    whatever LoRA was on is replaced); a lossless one takes it off. An mlx-lm LoRA folder (the
    next-token baseline) puts its LoRA on and returns None: no streams. Nothing changes when the
    folder does not fit."""
    adapter = read_adapter(folder, loaded)
    attach(adapter, loaded)
    return adapter.streams


def _acceptance(folder: Path, config: StreamConfig) -> Acceptance | None:
    """The folder's measured acceptance statistics (acceptance.json), which let the decoder
    choose its tree for the device; None when there are none."""
    acceptance = Acceptance.read(folder)
    if acceptance is not None and acceptance.gamma != config.gamma:
        raise SpecstreamError(
            f"{folder / ACCEPTANCE_FILE} counts {acceptance.gamma} streams; the adapter has "
            f"{config.gamma}"
        )
    return acceptance


def _check_base(folder: Path, config: dict, loaded, required: bool = True) -> None:
    """Refuse an adapter made for another base model (a folder from elsewhere may carry no
    fingerprint: `required=False` then leaves the check to the tensor shapes)."""
    if "base_model" not in config and not required:
        return
    if "base_model" not in config:
        raise SpecstreamError(
            f"unreadable {folder / CONFIG}: no base_model (the model the adapter was made for)"
        )
    base = config.get("base_model", {})
    if not isinstance(base, dict) or not isinstance(base.get("fingerprint", {}), dict):
        raise SpecstreamError(
            f"unreadable {folder / CONFIG}: base_model must be an object with a fingerprint "
            f"object, got {json.dumps(base)[:80]}"
        )
    theirs = base.get("fingerprint", {})
    ours = base_fingerprint(loaded)
    problems = [
        f"base {key}: adapter has {theirs.get(key)!r}, model has {ours[key]!r}"
        for key in ours
        if theirs.get(key) != ours[key]
    ]
    if problems:
        raise SpecstreamError(
            f"adapter {folder} was made for another base model "
            f"({base.get('name')}): " + "; ".join(problems)
        )


def _read_weights(folder: Path) -> dict[str, mx.array]:
    try:
        weights = mx.load(str(folder / WEIGHTS))
    except Exception as exc:  # mlx raises RuntimeError/ValueError on a broken file
        raise SpecstreamError(
            f"cannot read {folder / WEIGHTS}: corrupt or truncated ({exc})"
        ) from None
    bad = non_finite(weights)
    if bad:  # a diverged training run: its drafts would be garbage, its shared LoRA worse
        raise SpecstreamError(
            f"{folder / WEIGHTS} holds NaN or infinite values in {len(bad)} tensors "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): retrain it"
        )
    return weights


def non_finite(weights: dict[str, mx.array]) -> list[str]:
    """The names of the floating-point tensors holding a NaN or an infinity."""
    floats = {k: v for k, v in weights.items() if mx.issubdtype(v.dtype, mx.floating)}
    checks = {k: mx.all(mx.isfinite(v)) for k, v in floats.items()}
    mx.eval(checks)
    return sorted(k for k, ok in checks.items() if not ok.item())


def _read_lora_adapter(source: str, folder: Path, config: dict, loaded) -> Adapter:
    """An mlx-lm LoRA folder: LoRA on every linear layer of the last `num_layers` blocks (-1:
    all of them, as mlx-lm reads it), checked whole."""
    rank, scale, num_layers = next_token_settings(config, folder / CONFIG)
    n_layers = loaded.config["num_hidden_layers"]
    lora = config["lora_parameters"]
    if lora.get("keys") is not None:
        raise SpecstreamError(
            f"adapter {folder}: only LoRA on every linear layer of its blocks is supported "
            f"(keys {lora.get('keys')})"
        )
    _check_base(folder, config, loaded, required=False)
    n = n_layers if num_layers == -1 else min(num_layers, n_layers)
    blocks = tuple(range(n_layers - n, n_layers))
    weights = _read_weights(folder)
    expected = {
        k[len(PREFIX) :]: shape
        for k, shape in expected_lora_shapes(loaded.model, rank, blocks).items()
    }
    problems = _misfits(expected, weights)
    if problems:
        raise SpecstreamError(f"adapter {folder} does not fit: " + "; ".join(problems))
    tensors = {PREFIX + k: v.astype(mx.float32) for k, v in weights.items()}
    mx.eval(tensors)
    return Adapter(source, None, tensors, rank, float(scale))


def _misfits(expected: dict[str, tuple], weights: dict[str, mx.array]) -> list[str]:
    """Missing, unexpected and misshapen tensors: every kind shown, long lists cut per kind."""
    missing = [
        f"missing tensor {n} {list(expected[n])}" for n in sorted(set(expected) - set(weights))
    ]
    unexpected = [f"unexpected tensor {n}" for n in sorted(set(weights) - set(expected))]
    shapes = [
        f"{n}: shape {list(weights[n].shape)}, expected {list(expected[n])}"
        for n in sorted(set(weights) & set(expected))
        if tuple(weights[n].shape) != expected[n]
    ]
    problems = []
    for kind in (missing, unexpected, shapes):
        problems += kind[:10] + ([f"... {len(kind) - 10} more like it"] if len(kind) > 10 else [])
    return problems
