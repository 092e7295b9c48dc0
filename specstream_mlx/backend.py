"""Where the model runs: BLAS on Linux CPU, and which weight precision suits the device.

MLX's Linux CPU wheel links a reference BLAS (about 3 GFLOP/s for a float32 matmul here). A system
OpenBLAS loaded with RTLD_GLOBAL *before* `mlx.core` is imported takes over the `cblas_*` symbols
(about 150-200 GFLOP/s). This module must therefore be imported before anything imports mlx, which
`specstream_mlx/__init__.py` guarantees for users who import us first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
import warnings
from dataclasses import dataclass

# Debian/Ubuntu (`apt-get install libopenblas0-pthread`), Fedora/RHEL, Arch, Alpine.
_OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
BLAS_FIX = "install OpenBLAS (Debian/Ubuntu: apt-get install libopenblas0-pthread)"


@dataclass
class BlasStatus:
    """What provides `cblas_sgemm` to MLX in this process."""

    library: str | None  # path of the OpenBLAS we loaded, None if none
    reason: str  # why: "loaded", "not needed on this platform", "disabled", "not found", ...

    @property
    def fast(self) -> bool:
        return self.library is not None or self.reason == "not needed on this platform"


_status: BlasStatus | None = None
_warned = False


def _find_openblas() -> str | None:
    override = os.environ.get("SPECSTREAM_BLAS")
    if override:
        return override
    for path in _OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def preload_blas() -> BlasStatus:
    """Load a system OpenBLAS for MLX's Linux CPU backend; safe to call many times.

    Set SPECSTREAM_BLAS=none to keep MLX's own BLAS, or to a library path to choose one.
    """
    global _status
    if _status is not None:
        return _status
    if platform.system() != "Linux":
        _status = BlasStatus(None, "not needed on this platform")
    elif os.environ.get("SPECSTREAM_BLAS", "").lower() == "none":
        _status = BlasStatus(None, "disabled by SPECSTREAM_BLAS=none")
    elif "mlx.core" in sys.modules:
        _status = BlasStatus(None, "mlx.core was imported before specstream_mlx")
    else:
        path = _find_openblas()
        if path is None:
            _status = BlasStatus(None, "no system OpenBLAS found")
        else:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                _status = BlasStatus(path, "loaded")
            except OSError as exc:
                _status = BlasStatus(None, f"could not load {path}: {exc}")
    return _status


def warn_if_slow_blas() -> None:
    """Warn once, with the fix, when float32 matmuls on the CPU will use the reference BLAS."""
    global _warned
    status = preload_blas()
    if _warned or status.fast or not on_cpu() or "disabled" in status.reason:
        return
    _warned = True
    warnings.warn(
        f"MLX runs on the CPU with its reference BLAS ({status.reason}): float32 matmuls are "
        f"about 50x slower. Fix: {BLAS_FIX}, and import specstream_mlx before mlx.",
        RuntimeWarning,
        stacklevel=2,
    )


def on_cpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu


PRECISIONS = ("auto", "float32", "float16", "bfloat16", "q8", "q4", "stored")


def resolve_precision(precision: str, source_bits: int | None = None) -> str:
    """`auto` -> float32 on the CPU (there quantized matmuls cost more per token than float32 with
    OpenBLAS and do not get cheaper per token with more tokens in flight); on Metal and CUDA the
    weights as stored (`stored`: quantized layers stay quantized), or, for weights stored
    dequantized from a quantized source of `source_bits` bits (a K-quant GGUF), MLX's q4 (up to
    4 bits) or q8, near the source's size. q8 / q4: MLX's 8- or 4-bit affine quantization
    (group size 64) of the dequantized weights."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    if on_cpu():
        return "float32"
    if source_bits:
        return "q4" if source_bits <= 4 else "q8"
    return "stored"


def device_name() -> str:
    import mlx.core as mx

    device = mx.default_device()
    if device.type == mx.DeviceType.cpu:
        return f"cpu ({platform.machine()})"
    return "metal" if mx.metal.is_available() else "cuda"
