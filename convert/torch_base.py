"""Loading a base model on the torch side: the default model (dequantized from the same GGUF the
MLX runtime reads), a packaged model by name (`qwen2.5-coder-0.5b-instruct`, from its assembled
GGUF), any `.gguf` file, or a Hugging Face folder or hub id. The GGUF goes through
transformers' own GGUF loader, which dequantizes in float32 as llama.cpp does (and as the MLX
loader does since it casts the scales first), so both sides run bit-identical weights."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specstream_mlx.chat_safety import encode_chat
from specstream_mlx.errors import SpecstreamError
from specstream_mlx.models.gguf_meta import read_metadata
from specstream_mlx.models.gguf_tokenizer import gguf_tokenizer
from specstream_mlx.models.packaged import DEFAULT_MODEL, MODELS, packaged_gguf
from specstream_mlx.streams.fingerprint import fingerprint

# Families whose attention block has separate q/k/v/o projections and a gated MLP (optionally
# q/k norms and biases): the layer loop in torch_streams runs them. phi3 fuses qkv: not here.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,  # a reference for float32 rounding (parity tests)
}


@dataclass
class TorchBase:
    """A transformers causal LM with its tokenizer, as the torch decoder and trainer use it."""

    model: torch.nn.Module  # a *ForCausalLM (PEFT wraps it in place for shared-mode LoRA)
    tokenizer: object
    name: str
    config: dict
    # config.json as written, when the model came from a folder: the MLX runtime fingerprints
    # that, and transformers' config object fills in defaults it may lack
    raw_config: dict | None = None
    _fingerprint: dict | None = field(default=None, repr=False)
    # the weights, as loaded, of the projections a decoding adapter's LoRA is merged into
    # (torch_adapter._put_lora): remove_lora puts them back exactly
    unmerged: dict | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.config.get("eos_token_id")
        ids = set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def fingerprint(self) -> dict:
        """The same fingerprint the MLX runtime checks adapters against."""
        if self._fingerprint is None:
            config = self.raw_config if self.raw_config is not None else self.config
            self._fingerprint = fingerprint(config, self.tokenizer.get_vocab())
        return dict(self._fingerprint)

    def encode_chat(self, prompt: str) -> list[int]:
        """A user turn through the chat template with the assistant's turn opened (the same ids
        as the MLX runtime's `encode_prompt`: control-token texts typed in a prompt stay
        text)."""
        messages = [{"role": "user", "content": prompt}]
        if getattr(self.tokenizer, "chat_template", None):
            return encode_chat(ChatTokenizer(self.tokenizer), messages)
        return list(self.tokenizer.encode(prompt))


class ChatTokenizer:
    """A transformers tokenizer as the mlx-free modules expect one (mlx-lm's wrapper's view):
    `has_chat_template`, and `apply_chat_template` returning plain id lists (transformers 5
    returns an encoding object)."""

    def __init__(self, tokenizer):
        self.tokenizer = self._tokenizer = tokenizer  # _tokenizer: what the wrapper wraps
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        if not tokenize:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        return chat_ids(self.tokenizer, messages, add_generation_prompt)


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    """`apply_chat_template` as a list of ids (transformers 5 returns an encoding object)."""
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    if hasattr(out, "keys") and "input_ids" in out.keys():
        out = out["input_ids"]
    return list(out)


def usable_device(name: str) -> torch.device:
    """`name` as a torch device this machine has, or a clear error (checked before loading)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise SpecstreamError(f"--device {name}: not a torch device (cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecstreamError(f"--device {name}: this torch sees no CUDA GPU; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SpecstreamError(f"--device {name}: this machine has {torch.cuda.device_count()} GPUs")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise SpecstreamError(f"--device {name}: MPS is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise SpecstreamError(f"--device {name}: the torch path runs on cpu, cuda or mps")
    return device


def load_base(name: str | None = None, device: str = "cpu", dtype: str = "float32") -> TorchBase:
    """Load a base model for the torch path (see the module docstring for names)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    device = usable_device(device)
    if dtype not in _DTYPES:
        raise SpecstreamError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    logging.disable_progress_bar()
    kwargs = {}
    if name in (None, "", "default"):
        name = DEFAULT_MODEL
    if name in MODELS:  # a packaged model by name (the default, `qwen2.5-coder-0.5b-instruct`)
        gguf = packaged_gguf(name)
        folder, kwargs = gguf.parent, {"gguf_file": gguf.name}
    else:
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            folder, kwargs = path.parent, {"gguf_file": path.name}
        elif path.is_file():
            raise SpecstreamError(f"model file {path} is not a .gguf file (or give a folder)")
        elif path.exists():
            folder = path
        elif name.count("/") == 1 and not name.startswith((".", "/", "~")):
            folder = name  # a hub id (owner/name), as the MLX runtime reads one
        else:
            raise SpecstreamError(
                f"model {name!r} not found: not a folder, a .gguf file, a packaged model "
                f"({', '.join(MODELS)}) or a hub id (owner/name)"
            )
    # a GGUF's metadata first: a corrupt or cut file gets the MLX runtime's clear error
    metadata = read_metadata(folder / kwargs["gguf_file"]) if kwargs else None
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=_DTYPES[dtype], **kwargs)
        # a GGUF's tokenizer as the MLX runtime builds it (transformers' lacks the digit split)
        if metadata is not None:
            tokenizer = gguf_tokenizer(metadata)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, ImportError, EOFError, struct.error) as exc:  # struct: a cut GGUF
        raise SpecstreamError(f"cannot load model {name or DEFAULT_MODEL!r}: {exc}") from None
    config = model.config.to_dict()
    if config.get("model_type") not in SUPPORTED:
        raise SpecstreamError(
            f"the torch path supports {', '.join(SUPPORTED)}; this model is "
            f"{config.get('model_type')!r}"
        )
    model.to(device).eval()
    model.requires_grad_(False)
    raw = None
    if not kwargs and (Path(str(folder)) / "config.json").is_file():
        raw = json.loads((Path(str(folder)) / "config.json").read_text())
    return TorchBase(model, tokenizer, name or DEFAULT_MODEL, config, raw)
