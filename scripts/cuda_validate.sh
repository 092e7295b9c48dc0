#!/usr/bin/env bash
# The PyTorch path's CUDA validation on a lent GPU machine (the device tool), which has torch,
# transformers and peft but no network and takes at most 64 MiB per call. The default model's
# GGUF (98 MB) therefore travels in two halves, in two calls made within the machine's 30 s
# keep-warm window:
#
#   here:        scripts/cuda_validate.sh prepare          # runs/cuda1 (half 1, gguf wheel,
#                                                          # prompts), runs/cuda2 (half 2)
#   device call: carry ["runs/cuda1"], command "true"
#   device call: carry ["runs/cuda2"], command "bash scripts/cuda_validate.sh run chat"
#
# `run ADAPTER` joins the halves, installs the `gguf` reader from the carried wheel (offline) and
# writes $OUT/cuda_ADAPTER.json (the bench schema) with the markdown table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
    gguf=$(./dev.sh python -c 'from specstream_mlx.models.default import default_gguf_path; print(default_gguf_path())')
    rm -rf runs/cuda1 runs/cuda2 && mkdir -p runs/cuda1/wheels runs/cuda2
    size=$(stat -c %s "$gguf")
    head -c $((size / 2)) "$gguf" > runs/cuda1/model.gguf.part1
    tail -c +$((size / 2 + 1)) "$gguf" > runs/cuda2/model.gguf.part2
    ./dev.sh python -m pip download -q --no-deps -d runs/cuda1/wheels gguf
    ./dev.sh python - <<'PY'
import json, os
from pathlib import Path
from specstream_mlx.training.chat_prompts import build_chat_mix
data = Path(os.environ.get("SPECSTREAM_DATA", "../shared/data"))
with open("runs/cuda1/prompts.jsonl", "w") as f:
    for category, prompt in build_chat_mix(data, 16, seed=1, split="dev"):
        f.write(json.dumps({"category": category, "prompt": prompt}) + "\n")
PY
    (sha256sum "$gguf" | cut -d' ' -f1) > runs/cuda2/model.gguf.sha256
    du -sh runs/cuda1 runs/cuda2
    ;;
run)
    adapter=${2:-chat}
    out=${OUT:-runs}
    mkdir -p runs/cuda
    cat runs/cuda1/model.gguf.part1 runs/cuda2/model.gguf.part2 > runs/cuda/model.gguf
    echo "$(cat runs/cuda2/model.gguf.sha256)  runs/cuda/model.gguf" | sha256sum -c -
    python -c 'import gguf' 2>/dev/null || python -m pip install -q --no-deps --no-index runs/cuda1/wheels/*.whl
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    python -m convert.validate_cuda --model runs/cuda/model.gguf --adapter "$adapter" \
        --prompts runs/cuda1/prompts.jsonl --limit "${LIMIT:-16}" --max-tokens "${MAX_TOKENS:-64}" \
        --out "$out/cuda_$adapter.json"
    ;;
*)
    echo "usage: scripts/cuda_validate.sh prepare | run [ADAPTER]" >&2
    exit 2
    ;;
esac
