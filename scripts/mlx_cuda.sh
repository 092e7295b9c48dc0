#!/usr/bin/env bash
# This runtime (MLX, its own CUDA backend) on a lent GPU machine (the device tool), where a pass
# of a few rows costs about what one row does: the latency curve and the decoders against plain
# decoding and mlx-lm. The machine has torch and CUDA 13's libraries but no MLX and no network,
# and takes 64 MiB a call, the 23 MB working tree included. So `prepare` packs the MLX CUDA
# wheels (mlx, mlx-cuda-13: ~91 MB), mlx-lm, gguf, the default GGUF (98 MB) and the bench inputs
# into one archive cut into 26 MB parts, runs/mlxcuda1..N (8; printed), and each device call
# carries one part within the machine's 30 s keep-warm window (ignored paths a call carried stay
# there for the next):
#
#   here:         scripts/mlx_cuda.sh prepare
#   device calls: carry ["runs/mlxcuda1"], command "true"       (and so on up to N - 1)
#   device call:  carry ["runs/mlxcudaN"], command "bash scripts/mlx_cuda.sh run"
#
# `run` joins and checks the archive, installs the wheels in /tmp/site (offline, without their
# dependencies: the image's CUDA 13 libraries, linked in beside them, are the ones mlx-cuda-13
# names), measures the latency curve (`specstream calibrate`) and benches ar, ss, pld, ss+pld
# and mlx-lm on the chat suite's held-out questions, the sql and the e2e suites (LIMIT=12
# prompts x MAX_TOKENS=64), writing $OUT/mlxcuda_*.json. `rehearse` runs the same steps here,
# on the CPU with the MLX already installed (2 prompts x 16 tokens), before spending device time.
set -euo pipefail
cd "$(dirname "$0")/.."
PART=25M
pack=runs/mlxcuda/pack

bench_all() {  # PACK LIMIT MAX_TOKENS OUT PYTHON...
    local dir=$1 limit=$2 tokens=$3 out=$4
    shift 4
    local model=$dir/model.gguf
    "$@" -c 'import specstream_mlx, mlx.core as mx; print("mlx", mx.__version__, mx.default_device())'
    "$@" -m apps.cli calibrate --model "$model" --json > "$out/mlxcuda_calibration.json"
    for suite in specbench sql e2e; do
        case $suite in
        specbench) data=$dir/chat_questions.jsonl ;;
        sql) data=$dir/sql_dev.jsonl ;;
        e2e) data=$dir/e2e_dev.csv ;;
        esac
        "$@" -m apps.cli bench --suite $suite --data "$data" --model "$model" \
            --methods ar,ss,pld,ss+pld,mlx-lm --limit "$limit" --max-tokens "$tokens" \
            --json "$out/mlxcuda_$suite.json" || echo "bench $suite failed: rc $?"
    done
}

case "${1:-}" in
prepare)
    rm -rf runs/mlxcuda runs/mlxcuda[0-9]* && mkdir -p $pack/wheels
    versions=$(./dev.sh python -c 'import mlx.core as mx, mlx_lm, gguf, importlib.metadata as m
print(mx.__version__, m.version("mlx-lm"), m.version("gguf"))')
    read -r mlx_v lm_v gguf_v <<< "$versions"
    ./dev.sh python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_35_x86_64 -d $pack/wheels \
        "mlx==$mlx_v" "mlx-cuda-13==$mlx_v" "mlx-lm==$lm_v" "gguf==$gguf_v"
    cp "$(./dev.sh python -c 'from specstream_mlx.models.packaged import default_gguf_path
print(default_gguf_path())')" $pack/model.gguf
    ./dev.sh python - <<'PY'
import json, os, shutil
from pathlib import Path
from specstream_mlx.training.chat_prompts import build_chat_mix
data = Path(os.environ.get("SPECSTREAM_DATA", "../shared/data"))
pack = Path("runs/mlxcuda/pack")
with open(pack / "chat_questions.jsonl", "w") as f:  # the chat suite, as specbench questions
    for i, (category, prompt) in enumerate(build_chat_mix(data, 16, seed=1, split="dev")):
        f.write(json.dumps({"question_id": i, "category": category, "turns": [prompt]}) + "\n")
shutil.copy(data / "sql/dev.jsonl", pack / "sql_dev.jsonl")  # for this run only, not the repo
shutil.copy(data / "e2e/dev.csv", pack / "e2e_dev.csv")
PY
    tar -cf runs/mlxcuda/pack.tar -C runs/mlxcuda pack
    split -b $PART -d -a 1 --numeric-suffixes=1 runs/mlxcuda/pack.tar runs/mlxcuda/pack.tar.part
    n=$(ls runs/mlxcuda/pack.tar.part* | wc -l)
    for i in $(seq 1 "$n"); do
        mkdir -p "runs/mlxcuda$i" && mv "runs/mlxcuda/pack.tar.part$i" "runs/mlxcuda$i/"
    done
    (sha256sum runs/mlxcuda/pack.tar | cut -d' ' -f1) > "runs/mlxcuda$n/pack.tar.sha256"
    rm runs/mlxcuda/pack.tar
    du -sh runs/mlxcuda[0-9]*
    echo "$n parts: carry runs/mlxcuda1 .. runs/mlxcuda$n, one a call, the last one running 'run'"
    ;;
rehearse)
    out=runs/mlxcuda/rehearsal && mkdir -p $out
    bench_all $pack 2 16 $out ./dev.sh python
    ls -la $out
    ;;
run)
    out=${OUT:-runs}
    cat $(ls runs/mlxcuda[0-9]*/pack.tar.part* | sort -V) > /tmp/pack.tar
    echo "$(cat runs/mlxcuda[0-9]*/pack.tar.sha256)  /tmp/pack.tar" | sha256sum -c -
    tar -xf /tmp/pack.tar -C /tmp
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/pack/wheels/*.whl
    # libmlx.so finds CUDA's libraries at $ORIGIN/../../nvidia/*/lib: the image's, beside torch
    ln -sfn "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" /tmp/site/nvidia
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    export PYTHONPATH=$PWD:/tmp/site SPECSTREAM_CACHE=/tmp/specstream-cache
    bench_all /tmp/pack "${LIMIT:-12}" "${MAX_TOKENS:-64}" "$out" python3
    ;;
*)
    echo "usage: scripts/mlx_cuda.sh prepare | rehearse | run" >&2
    exit 2
    ;;
esac
