"""Adapter folders of the two runtimes, and the conversion between them. numpy, safetensors and
json only: converting needs neither torch nor MLX.

PyTorch folder (written by convert.torch_train, read by convert.torch_streams' loader):
- `stream_config.json`: {"format_version", "stream_config", "base_model": {"name",
  "fingerprint"}, "shapes"}, the same fields as the MLX folder's adapter_config.json;
- `streams.safetensors`: `stream_embeddings` (gamma, d), `adapters.{i}.down.weight` (r, d),
  `adapters.{i}.up.weight` (d, r), `prune.down.weight`, `prune.up.weight` (torch Linear layout),
  with attention_adapters `attention_adapters.{i}.down.weight` / `.up.weight` as well, and with
  next_token_guess `guess` (d, d), applied as x @ guess in both runtimes, and with parent_rank
  `parent_heads.{j}.a` (2d, r) and `.b` (r, d), likewise;
- shared mode only, a PEFT LoRA folder: `adapter_config.json` (peft LoraConfig) and
  `adapter_model.safetensors` (`base_model.model.model.layers.{L}.{module}.lora_A.weight` (r, in)
  and `lora_B.weight` (out, r)), loadable with `peft.PeftModel.from_pretrained`.

MLX folder (specstream_mlx.streams.adapter_io): `adapter_config.json` + `adapters.safetensors`
with `adapters.{i}.a` (d, r) = down.weight^T, `adapters.{i}.b` (r, d) = up.weight^T, the same for
`attention_adapters` and `prune`, and `lora.model.layers.{L}.{module}.lora_a` (in, r) =
lora_A^T, `lora_b` (r, out) = lora_B^T. LoRA scale: MLX multiplies by `lora_scale`, PEFT by
lora_alpha / r (alpha / sqrt(r) with use_rslora), so alpha = scale * r.

Both kinds may carry companions, copied byte for byte by a conversion: `acceptance.json` (the
streams' measured acceptance, from which the MLX runtime chooses its draft tree) and `README.md`
(the adapter's card: what it was trained on, and the data's licences and attributions).

Every tensor keeps its dtype (float16 stays float16) unless `lora_as` stores the LoRA as float16
(`specstream convert --lora-dtype float16`) or `heads_as` the streams' parent heads
(`--heads-dtype float16`); bfloat16, which numpy cannot hold, is widened to
float32 exactly. float32 and float16 folders round-trip bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from specstream_mlx.errors import SpecstreamError
from specstream_mlx.folders import staged_folder
from specstream_mlx.streams.config import StreamConfig, saved_stream_config
from specstream_mlx.streams.config import next_token_settings as config_settings

TORCH_STREAMS, TORCH_CONFIG = "streams.safetensors", "stream_config.json"
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
MLX_WEIGHTS, MLX_CONFIG = "adapters.safetensors", "adapter_config.json"
ACCEPTANCE = "acceptance.json"
COMPANIONS = (ACCEPTANCE, "README.md")  # carried as they are, in either direction
MLX_LORA_PREFIX = "lora."
PEFT_PREFIX = "base_model.model."
# The linear layers of a block, as the MLX runtime wraps them all with LoRA (short PEFT names).
LORA_MODULES = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
_ADAPTERS = "(adapters|attention_adapters)"  # the MLP path's, and the attention path's
_STREAM_T2M = [  # torch name pattern -> MLX name, transposed
    (re.compile(r"^stream_embeddings$"), lambda m: "stream_embeddings", False),
    (re.compile(r"^guess$"), lambda m: "guess", False),
    (re.compile(r"^parent_heads\.(\d+)\.([ab])$"), lambda m: f"parent_heads.{m[1]}.{m[2]}", False),
    (re.compile(rf"^{_ADAPTERS}\.(\d+)\.down\.weight$"), lambda m: f"{m[1]}.{m[2]}.a", True),
    (re.compile(rf"^{_ADAPTERS}\.(\d+)\.up\.weight$"), lambda m: f"{m[1]}.{m[2]}.b", True),
    (re.compile(r"^prune\.down\.weight$"), lambda m: "prune.a", True),
    (re.compile(r"^prune\.up\.weight$"), lambda m: "prune.b", True),
]
_STREAM_M2T = [
    (re.compile(r"^stream_embeddings$"), lambda m: "stream_embeddings", False),
    (re.compile(r"^guess$"), lambda m: "guess", False),
    (re.compile(r"^parent_heads\.(\d+)\.([ab])$"), lambda m: f"parent_heads.{m[1]}.{m[2]}", False),
    (re.compile(rf"^{_ADAPTERS}\.(\d+)\.a$"), lambda m: f"{m[1]}.{m[2]}.down.weight", True),
    (re.compile(rf"^{_ADAPTERS}\.(\d+)\.b$"), lambda m: f"{m[1]}.{m[2]}.up.weight", True),
    (re.compile(r"^prune\.a$"), lambda m: "prune.down.weight", True),
    (re.compile(r"^prune\.b$"), lambda m: "prune.up.weight", True),
]
_PEFT_LORA = re.compile(r"^base_model\.model\.(model\.layers\.\d+\.(.+))\.lora_([AB])\.weight$")
_MLX_LORA = re.compile(r"^lora\.(model\.layers\.\d+\.(.+))\.lora_([ab])$")


@dataclass
class Folder:
    """An adapter folder of either runtime, in memory."""

    kind: str  # "torch" | "mlx"
    config: dict  # stream_config.json (torch) or adapter_config.json (mlx)
    tensors: dict[str, np.ndarray]  # streams (torch) or everything (mlx)
    lora: dict[str, np.ndarray] = field(default_factory=dict)  # torch: PEFT tensors
    peft_config: dict | None = None  # torch, shared mode
    companions: dict[str, bytes] = field(default_factory=dict)  # file name -> its bytes

    @property
    def stream_config(self) -> StreamConfig:
        try:
            return StreamConfig.from_dict(self.config["stream_config"]).validate()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SpecstreamError(f"unreadable stream config: {exc}") from None


def folder_kind(path: str | os.PathLike) -> str:
    """ "torch" or "mlx"; a clear error for anything else."""
    path = Path(path)
    if path.is_file():
        raise SpecstreamError(f"{path} is a file: give an adapter folder")
    if not path.is_dir():
        raise SpecstreamError(f"adapter folder not found: {path}")
    if (path / TORCH_CONFIG).is_file():
        if not (path / TORCH_STREAMS).is_file():
            raise SpecstreamError(
                f"a PyTorch adapter folder needs its streams: {path / TORCH_STREAMS}"
            )
        return "torch"
    if (path / MLX_CONFIG).is_file() and (path / MLX_WEIGHTS).is_file():
        return "mlx"
    raise SpecstreamError(
        f"{path} is neither a PyTorch adapter folder ({TORCH_CONFIG} + {TORCH_STREAMS}, and "
        f"{PEFT_CONFIG} + {PEFT_WEIGHTS} in shared mode) nor an MLX one ({MLX_CONFIG} + "
        f"{MLX_WEIGHTS})"
    )


def read_folder(path: str | os.PathLike) -> Folder:
    path = Path(path)
    kind = folder_kind(path)
    if kind == "mlx":
        config = _checked_base(_read_json(path / MLX_CONFIG), path / MLX_CONFIG)
        if "stream_config" not in config:
            raise SpecstreamError(
                f"{path} is an MLX LoRA folder without streams: only stream adapters convert"
            )
        saved_stream_config(config, path / MLX_CONFIG)
        folder = Folder("mlx", config, read_tensors(path / MLX_WEIGHTS))
    else:
        config = _checked_base(_read_json(path / TORCH_CONFIG), path / TORCH_CONFIG)
        saved_stream_config(config, path / TORCH_CONFIG)
        folder = Folder("torch", config, read_tensors(path / TORCH_STREAMS))
    if kind == "torch" and folder.stream_config.mode == "shared":
        for name in (PEFT_CONFIG, PEFT_WEIGHTS):
            if not (path / name).is_file():
                raise SpecstreamError(f"a shared-mode adapter needs its PEFT LoRA: {path / name}")
        folder.peft_config = _read_json(path / PEFT_CONFIG)
        folder.lora = read_tensors(path / PEFT_WEIGHTS)
    folder.companions = _companions(path, folder)
    return folder


def is_next_token_folder(path: str | os.PathLike) -> bool:
    """An MLX LoRA folder without streams (`specstream train --mode next-token`, mlx-lm's layout),
    such as a writing tool's same-budget next-token baseline."""
    path = Path(path)
    if (path / TORCH_CONFIG).is_file() or folder_kind(path) != "mlx":
        return False
    return "stream_config" not in _read_json(path / MLX_CONFIG)


def next_token_settings(path: str | os.PathLike) -> tuple[int, float, int]:
    """A next-token LoRA folder's rank, scale and block count (`streams.config`'s reading of its
    config), read before any model loads; a clear error for any other folder."""
    path = Path(path)
    if not is_next_token_folder(path):
        raise SpecstreamError(
            f"{path} is a stream adapter, not a next-token LoRA "
            "(specstream train --mode next-token)"
        )
    return config_settings(_read_json(path / MLX_CONFIG), path / MLX_CONFIG)


def read_next_token_lora(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """A next-token LoRA folder's config and its LoRA as PEFT tensors (`lora_A.weight` (r, in),
    `lora_B.weight` (out, r)), for shared-mode training that starts from it."""
    path = Path(path)
    config = _checked_base(_read_json(path / MLX_CONFIG), path / MLX_CONFIG)
    lora, problems = {}, []
    for name, value in read_tensors(path / MLX_WEIGHTS).items():
        m = _MLX_LORA.match(MLX_LORA_PREFIX + name)
        if m is None:
            problems.append(f"unexpected tensor {name} in {MLX_WEIGHTS}")
            continue
        lora[f"{PEFT_PREFIX}{m[1]}.lora_{m[3].upper()}.weight"] = value.T
    if problems:
        raise SpecstreamError(f"unreadable LoRA folder {path}: " + "; ".join(_cut(problems)))
    return config, lora


def next_token_folder(config: dict, peft_lora: dict[str, np.ndarray]) -> Folder:
    """The MLX next-token LoRA folder (mlx-lm's layout, as `specstream train --mode next-token`
    writes it) of PEFT LoRA tensors: the inverse of `read_next_token_lora`."""
    tensors, problems = {}, []
    for name, value in peft_lora.items():
        m = _PEFT_LORA.match(name)
        if m is None:
            problems.append(f"unexpected LoRA tensor {name}")
            continue
        tensors[f"{m[1]}.lora_{m[3].lower()}"] = value.T
    if problems:
        raise SpecstreamError("cannot write the LoRA: " + "; ".join(_cut(problems)))
    return Folder("mlx", config, tensors)


def _companions(path: Path, folder: Folder) -> dict[str, bytes]:
    """The folder's companion files, an acceptance.json only once it reads as statistics of
    the folder's streams (a conversion must not carry what the runtime would refuse)."""
    from specstream_mlx.streams.acceptance import Acceptance

    found = {n: (path / n).read_bytes() for n in COMPANIONS if (path / n).is_file()}
    if ACCEPTANCE in found:
        acceptance, gamma = Acceptance.read(path), folder.stream_config.gamma
        if acceptance.gamma != gamma:
            raise SpecstreamError(
                f"{path / ACCEPTANCE} counts {acceptance.gamma} streams; the adapter has {gamma}"
            )
    return found


def _checked_base(config: dict, path: Path) -> dict:
    """The config, once its base_model is known to be {"name", "fingerprint": {...}} or absent."""
    base = config.get("base_model", {})
    if not isinstance(base, dict) or not isinstance(base.get("fingerprint", {}), dict):
        raise SpecstreamError(
            f"unreadable {path}: base_model must be an object with a fingerprint object"
        )
    if not isinstance(base.get("name", ""), str):
        raise SpecstreamError(f"unreadable {path}: base_model's name must be a string")
    return config


def write_folder(
    path: str | os.PathLike, folder: Folder, overwrite: bool = False, check=None
) -> Path:
    """Write atomically: built beside the target, checked there (`check(tmp_path)` may raise),
    then renamed into place; an existing folder is moved aside first and removed last, so a
    reader finds the old folder or the new one, never neither."""
    path = Path(path)
    with staged_folder(path, overwrite) as tmp:
        files = {}
        if folder.kind == "mlx":
            files = {MLX_WEIGHTS: folder.tensors, MLX_CONFIG: folder.config}
        else:
            files = {TORCH_STREAMS: folder.tensors, TORCH_CONFIG: folder.config}
            if folder.peft_config is not None:
                files.update({PEFT_WEIGHTS: folder.lora, PEFT_CONFIG: folder.peft_config})
        files.update(folder.companions)
        for name, content in files.items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            elif name.endswith(".safetensors"):
                save_file(_contiguous(content), str(tmp / name))
            else:
                _write_json(tmp / name, content)
            (tmp / name).chmod(0o644)  # safetensors writes owner-only files
        if check is not None:
            check(tmp)
    return path


def torch_to_mlx(src: Folder) -> tuple[Folder, dict[str, str]]:
    """The MLX folder of a PyTorch one, and for each MLX tensor name the name it came from."""
    cfg = src.stream_config
    tensors, origin, problems = {}, {}, []
    for name, value in src.tensors.items():
        mlx_name, transpose = _rename(name, _STREAM_T2M)
        if mlx_name is None:
            problems.append(f"unexpected tensor {name} in {TORCH_STREAMS}")
            continue
        tensors[mlx_name], origin[mlx_name] = (value.T if transpose else value), name
    if cfg.mode == "shared":
        _check_peft_config(src.peft_config, cfg, problems)
        for name, value in src.lora.items():
            m = _PEFT_LORA.match(name)
            if m is None or m[2] not in LORA_MODULES.values():
                problems.append(f"unexpected tensor {name} in {PEFT_WEIGHTS}")
                continue
            mlx_name = f"{MLX_LORA_PREFIX}{m[1]}.lora_{m[3].lower()}"
            tensors[mlx_name], origin[mlx_name] = value.T, name
    if problems:
        raise SpecstreamError("cannot convert: " + "; ".join(_cut(problems)))
    config = {k: v for k, v in src.config.items() if k != "shapes"}
    config["shapes"] = {name: list(v.shape) for name, v in tensors.items()}
    return Folder("mlx", config, tensors, companions=src.companions), origin


def mlx_to_torch(src: Folder) -> tuple[Folder, dict[str, str]]:
    """The PyTorch folder of an MLX one, and for each torch tensor name the MLX name."""
    cfg = src.stream_config
    streams, lora, origin, problems = {}, {}, {}, []
    for name, value in src.tensors.items():
        m = _MLX_LORA.match(name)
        if m is not None and cfg.mode == "shared":
            peft_name = f"{PEFT_PREFIX}{m[1]}.lora_{m[3].upper()}.weight"
            lora[peft_name], origin[peft_name] = value.T, name
            continue
        torch_name, transpose = _rename(name, _STREAM_M2T)
        if torch_name is None:
            problems.append(f"unexpected tensor {name} in {MLX_WEIGHTS}")
            continue
        streams[torch_name], origin[torch_name] = (value.T if transpose else value), name
    if problems:
        raise SpecstreamError("cannot convert: " + "; ".join(_cut(problems)))
    config = {k: v for k, v in src.config.items() if k != "shapes"}
    config["shapes"] = {name: list(v.shape) for name, v in {**streams, **lora}.items()}
    peft = None
    if cfg.mode == "shared":
        targets = sorted({_short(_MLX_LORA.match(n)[2]) for n in src.tensors if _MLX_LORA.match(n)})
        peft = peft_config(cfg, targets, src.config.get("base_model", {}).get("name"))
    return Folder("torch", config, streams, lora, peft, src.companions), origin


def lora_as(folder: Folder, dtype: str) -> Folder:
    """The folder with its LoRA tensors stored as `dtype` ("float16" or "float32"; the streams
    keep theirs). float16 halves a shared adapter with LoRA in every block; both runtimes widen
    it to float32 on loading, so the weights decoded with are the float16 values exactly.
    Refused where a value exceeds float16's range."""
    if folder.kind == "torch":
        names = set(folder.lora)
        return replace(folder, lora=_stored_as(folder.lora, names, dtype, "LoRA"))
    names = {n for n in folder.tensors if _MLX_LORA.match(n)}
    return replace(folder, tensors=_stored_as(folder.tensors, names, dtype, "LoRA"))


def heads_as(folder: Folder, dtype: str) -> Folder:
    """The folder with its streams' parent heads (`parent_heads.{j}.a` / `.b`, the largest
    stream tensors) stored as `dtype`, as `lora_as` stores
    LoRA: widened to float32 on loading in both runtimes. They only draft, so a lossless
    decoder's tokens cannot change; what can is which drafts they make (measured per adapter:
    docs/BENCHMARKS.md, "Parent heads as float16")."""
    names = {n for n in folder.tensors if n.startswith("parent_heads.")}
    return replace(folder, tensors=_stored_as(folder.tensors, names, dtype, "parent-head"))


def _stored_as(store: dict, names: set[str], dtype: str, what: str) -> dict[str, np.ndarray]:
    """`store` with the tensors `names` cast to `dtype`, refused where a value exceeds its
    range."""
    limit = np.finfo(np.dtype(dtype)).max
    big = [n for n in sorted(names) if np.abs(store[n]).max(initial=0.0) > limit]
    if big:
        raise SpecstreamError(
            f"{what} values beyond {dtype}'s range in {', '.join(_cut(big, 5))}: keep float32"
        )
    return {n: (v.astype(dtype) if n in names else v) for n, v in store.items()}


def peft_config(cfg: StreamConfig, targets: list[str], base_name: str | None) -> dict:
    """A peft LoraConfig (as `save_pretrained` writes it) for shared mode's LoRA layers."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": cfg.lora_rank,
        "lora_alpha": cfg.lora_scale * cfg.lora_rank,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        # LoRA in the blocks the adapter stores (its stream config's lora_blocks), or every one
        "layers_to_transform": None if cfg.lora_blocks is None else list(cfg.lora_blocks),
        "layers_pattern": None if cfg.lora_blocks is None else "layers",
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }


def check_against(
    folder: Folder, fingerprint: dict, expected: dict[str, tuple], origin: dict[str, str]
) -> None:
    """Refuse a converted MLX folder that does not fit the target base: the fingerprint fields
    that differ, then every missing, unexpected and misshapen tensor, named in both formats."""
    theirs = folder.config.get("base_model", {}).get("fingerprint")
    problems = []
    if theirs is not None:
        problems += [
            f"base {key}: adapter has {theirs.get(key)!r}, target base has {fingerprint[key]!r}"
            for key in fingerprint
            if theirs.get(key) != fingerprint[key]
        ]

    def named(n):
        return f"{n} (from {origin[n]})" if n in origin and origin[n] != n else n

    have = folder.tensors
    problems += [
        f"missing tensor {n} {list(expected[n])}" for n in sorted(set(expected) - set(have))
    ]
    problems += [f"unexpected tensor {named(n)}" for n in sorted(set(have) - set(expected))]
    problems += [
        f"{named(n)}: shape {list(have[n].shape)}, expected {list(expected[n])}"
        for n in sorted(set(have) & set(expected))
        if tuple(have[n].shape) != tuple(expected[n])
    ]
    if problems:
        raise SpecstreamError(
            "the adapter does not fit the target base: " + "; ".join(_cut(problems))
        )


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file as numpy arrays; bfloat16 tensors are widened to float32 (exact).
    Weights that hold NaN or infinity (a diverged training run) are refused: converted, they
    would decode silently wrong on the other side."""
    try:
        tensors = load_file(str(path))
    except TypeError:  # numpy has no bfloat16: read those tensors from the raw bytes
        tensors = _read_with_bfloat16(path)
    except Exception as exc:  # safetensors raises its own error types on broken files
        raise SpecstreamError(f"cannot read {path}: corrupt or truncated ({exc})") from None
    bad = [n for n, v in tensors.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
    if bad:
        raise SpecstreamError(
            f"{path} holds NaN or infinite weights ({', '.join(_cut(sorted(bad), 5))}): "
            "the training that wrote it diverged"
        )
    return tensors


def _read_with_bfloat16(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    dtypes = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, info in header.items():
        start, end = (8 + size + o for o in info["data_offsets"])
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw[start:end], np.uint16).astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(info["shape"])
        elif info["dtype"] in dtypes:
            out[name] = np.frombuffer(raw[start:end], dtypes[info["dtype"]]).reshape(info["shape"])
        else:
            raise SpecstreamError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
    return out


def _check_peft_config(peft: dict | None, cfg: StreamConfig, problems: list[str]) -> None:
    """Only what the MLX runtime computes: LoRA on every linear layer of every block (or of the
    blocks the stream config's lora_blocks names), one rank, scale alpha / r, no DoRA, no bias,
    no fully trained modules."""
    if not isinstance(peft, dict):
        problems.append(f"{PEFT_CONFIG} is not a JSON object")
        return
    if peft.get("peft_type", "LORA") != "LORA":
        problems.append(f"PEFT type {peft.get('peft_type')!r} is not LORA")
    targets = peft.get("target_modules")
    if targets is None:
        problems.append(
            "PEFT target_modules is missing: PEFT would pick its default modules; the MLX "
            "runtime puts LoRA on every linear layer of every block"
        )
    if targets == "all-linear":
        targets = list(LORA_MODULES)
    elif isinstance(targets, str):
        problems.append(f"target_modules given as a pattern ({targets!r}): list the module names")
        targets = []
    elif targets is not None and not (
        isinstance(targets, list) and all(isinstance(t, str) for t in targets)
    ):
        problems.append(f"PEFT target_modules must be a list of module names, got {targets!r}")
        targets = []
    unknown = sorted(set(targets or []) - set(LORA_MODULES))
    if unknown:
        problems.append(f"unknown PEFT target modules {unknown} (known: {', '.join(LORA_MODULES)})")
    lacking = sorted(set(LORA_MODULES) - set(targets or []))
    if targets and lacking:
        problems.append(
            f"PEFT target_modules lacks {lacking}: the MLX runtime puts LoRA on every linear "
            "layer of every block (train with target_modules='all-linear')"
        )
    if peft.get("use_dora"):
        problems.append("PEFT use_dora=True is not supported by the MLX runtime")
    blocks = peft.get("layers_to_transform")
    blocks = [blocks] if isinstance(blocks, int) else blocks  # PEFT takes one index too
    if blocks not in (None, []):  # LoRA in some blocks: the ones the stream config names
        if cfg.lora_blocks is None or list(blocks) != list(cfg.lora_blocks):
            problems.append(
                f"PEFT layers_to_transform={blocks!r} disagrees with the stream config's "
                f"lora_blocks={cfg.lora_blocks!r}"
            )
        if peft.get("layers_pattern") not in (None, "layers", ["layers"]):
            problems.append(f"PEFT layers_pattern={peft['layers_pattern']!r}: only 'layers'")
    for key in (
        "modules_to_save",
        "rank_pattern",
        "alpha_pattern",
        "exclude_modules",
        "target_parameters",
    ):
        if peft.get(key) not in (None, {}, []):
            problems.append(f"PEFT {key}={peft[key]!r} is not supported by the MLX runtime")
    if peft.get("bias", "none") != "none":
        problems.append(f"PEFT bias={peft.get('bias')!r} is not supported (only 'none')")
    r, alpha = peft.get("r"), peft.get("lora_alpha")
    if not isinstance(r, int) or not isinstance(alpha, (int, float)) or r < 1:
        problems.append(f"{PEFT_CONFIG} needs an integer r and a number lora_alpha")
        return
    scale = alpha / (math.sqrt(r) if peft.get("use_rslora") else r)
    if r != cfg.lora_rank or not math.isclose(scale, cfg.lora_scale, rel_tol=1e-6):
        problems.append(
            f"PEFT r={r}, lora_alpha={alpha} (scale {scale:g}) disagree with the stream config's "
            f"lora_rank={cfg.lora_rank}, lora_scale={cfg.lora_scale:g}"
        )


def _rename(name: str, table) -> tuple[str | None, bool]:
    for pattern, new, transpose in table:
        m = pattern.match(name)
        if m is not None:
            return new(m), transpose
    return None, False


def _short(module_path: str) -> str:
    return module_path.rsplit(".", 1)[-1]


def _contiguous(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v) for k, v in tensors.items()}


def _cut(problems: list[str], shown: int = 30) -> list[str]:
    more = len(problems) - shown
    return problems[:shown] + ([f"... {more} more"] if more > 0 else [])


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecstreamError(f"unreadable {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecstreamError(f"unreadable {path}: not a JSON object")
    return data


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
