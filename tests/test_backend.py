"""BLAS and precision choice on the CPU backend."""

import platform
import subprocess
import sys

import pytest

from specstream_mlx import backend


@pytest.mark.skipif(platform.system() != "Linux", reason="OpenBLAS preload is Linux-only")
def test_openblas_is_loaded_before_mlx():
    status = backend.preload_blas()
    assert status.library is not None and status.fast, status
    maps = open("/proc/self/maps").read()
    assert "libopenblas" in maps


@pytest.mark.skipif(platform.system() != "Linux", reason="OpenBLAS preload is Linux-only")
@pytest.mark.parametrize(
    "code, reason",
    [
        ("import specstream_mlx.backend as b; print(b.preload_blas().reason)", "disabled"),
        (
            "import mlx.core, specstream_mlx.backend as b; print(b.preload_blas().reason)",
            "imported before",
        ),
    ],
)
def test_blas_status_explains_itself(code, reason):
    env = {"SPECSTREAM_BLAS": "none"} if reason == "disabled" else {}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
    )
    assert reason in proc.stdout, proc.stderr


def test_slow_blas_warns_once_with_the_fix():
    code = (
        "import warnings, mlx.core, specstream_mlx.backend as b\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always'); b.warn_if_slow_blas(); b.warn_if_slow_blas()\n"
        "print(len(w), w[0].message if w else '')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if platform.system() == "Linux":
        assert proc.stdout.startswith("1 ") and "libopenblas0-pthread" in proc.stdout
    else:
        assert proc.stdout.startswith("0")


def test_precision_resolution():
    assert backend.resolve_precision("auto") == ("float32" if backend.on_cpu() else "stored")
    assert backend.resolve_precision("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="precision must be one of"):
        backend.resolve_precision("int3")


def test_auto_precision_on_a_gpu_requantizes_a_dequantized_k_quant(monkeypatch):
    """On Metal/CUDA `auto` keeps weights as stored, but weights a K-quant GGUF gave as float32
    are quantized again near the source's size; on the CPU they stay float32."""
    monkeypatch.setattr(backend, "on_cpu", lambda: False)
    assert backend.resolve_precision("auto") == "stored"
    assert backend.resolve_precision("auto", source_bits=4) == "q4"
    assert backend.resolve_precision("auto", source_bits=6) == "q8"
    assert backend.resolve_precision("float32", source_bits=4) == "float32"
    monkeypatch.setattr(backend, "on_cpu", lambda: True)
    assert backend.resolve_precision("auto", source_bits=4) == "float32"


def test_the_shared_loop_imports_without_mlx():
    """The PyTorch path runs the loop's framework-free half (decoding.host), the tree, prompt
    lookup, rejection sampling and the stream config on machines without MLX."""
    code = (
        "import sys\n"
        "for m in ('mlx', 'mlx.core', 'mlx.nn', 'mlx_lm'): sys.modules[m] = None\n"
        "import specstream_mlx.decoding.host, specstream_mlx.decoding.lookup\n"
        "import specstream_mlx.decoding.rejection, specstream_mlx.streams.config\n"
        "import specstream_mlx.training.positions, specstream_mlx.sampling_params\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
