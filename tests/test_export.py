"""`specstream export-model`: the default model as a folder that mlx-lm itself loads and runs."""

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load as mlx_lm_load
from mlx_lm import stream_generate as mlx_lm_stream_generate

import specstream_mlx as ss
from specstream_mlx.generate import encode_prompt
from specstream_mlx.models.gguf import _unpermute_rows


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "smollm2"
    proc = subprocess.run(
        [sys.executable, "-m", "specstream_apps.cli", "export-model", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_folder_has_what_mlx_lm_needs(exported):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.startswith(".") for n in names)


def test_mlx_lm_generates_what_we_generate(exported, default_model):
    model, tokenizer = mlx_lm_load(str(exported))
    prompt = encode_prompt(default_model, "What is the capital of France?")
    theirs = "".join(r.text for r in mlx_lm_stream_generate(model, tokenizer, prompt, max_tokens=7))
    ours = ss.generate(default_model, prompt, max_tokens=7).text
    assert theirs == ours == "The capital of France is Paris."


def test_same_logits_as_our_loader(exported, default_model):
    model, _ = mlx_lm_load(str(exported))  # quantized, as stored
    ids = mx.array(encode_prompt(default_model, "Name a colour."))[None]
    ours = np.array(default_model.model(ids))  # float32, dequantized
    theirs = np.array(model(ids).astype(mx.float32))
    assert np.abs(ours - theirs).max() < 0.5  # 4-bit matmul kernels vs float32 BLAS
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() > 0.9


def test_refuses_existing_folder_unless_overwrite(exported):
    cmd = [sys.executable, "-m", "specstream_apps.cli", "export-model", "--out", str(exported)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "exists" in proc.stderr and "--overwrite" in proc.stderr
    proc = subprocess.run(
        cmd + ["--overwrite", "--dtype", "float16"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "quantization" not in (exported / "config.json").read_text()


def test_unpermute_inverts_llama_cpp_permute():
    w = mx.arange(9 * 64 * 3).reshape(9 * 64, 3)
    half = 32
    permuted = w.reshape(9, 2, half, 3).swapaxes(1, 2).reshape(w.shape)  # llama.cpp's permute
    assert mx.array_equal(_unpermute_rows(permuted, 9), w)
