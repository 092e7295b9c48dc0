#!/usr/bin/env bash
# The PyTorch path's CUDA validation on a lent GPU machine (the device tool), which has torch,
# transformers and peft but no MLX, no network, and takes at most 64 MiB per call, the working
# tree included (about 20 MB). The default model's GGUF (98 MB) therefore travels in four parts,
# in four calls made within the machine's 30 s keep-warm window (ignored paths a call carries
# stay there for the next):
#
#   here:        scripts/cuda_validate.sh prepare     # runs/cuda1..4: a quarter of the GGUF each;
#                                                     # cuda1 also the gguf wheel and the prompts
#   device call: carry ["runs/cuda1"], command "true"   (likewise cuda2, cuda3)
#   device call: carry ["runs/cuda4"], command "bash scripts/cuda_validate.sh run chat"
#
# `run ADAPTER [SUITE]` (SUITE: chat, sql, e2e or dialogsum; 16 prompts each, as the bench
# reads them) joins the parts, checks their sha256, installs the `gguf` reader from the carried
# wheel (offline) and writes $OUT/cuda_ADAPTER_SUITE.json (the bench schema), the markdown table on
# stdout. Rehearse it here with `scripts/cuda_validate.sh rehearse` (CPU, MLX hidden).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
    gguf=$(./dev.sh python -c 'from specstream_mlx.models.packaged import default_gguf_path; print(default_gguf_path())')
    rm -rf runs/cuda runs/cuda[0-9] && mkdir -p runs/cuda runs/cuda1/wheels runs/cuda2 runs/cuda3 runs/cuda4
    split -n 4 -d -a 1 --numeric-suffixes=1 "$gguf" runs/cuda/part
    for i in 1 2 3 4; do mv "runs/cuda/part$i" "runs/cuda$i/model.gguf.part$i"; done
    ./dev.sh python -m pip download -q --no-deps -d runs/cuda1/wheels gguf
    ./dev.sh python - <<'PY'
import json, os
from pathlib import Path
from specstream_mlx.bench.suites import read_suite
data = Path(os.environ.get("SPECSTREAM_DATA", "../shared/data"))
files = {"chat": data, "sql": data / "sql/dev.jsonl", "e2e": data / "e2e/dev.csv",
         "dialogsum": data / "dialogsum/dev.jsonl"}
for suite, path in files.items():
    with open(f"runs/cuda1/prompts_{suite}.jsonl", "w") as f:
        for q in read_suite(suite, path, 16):
            f.write(json.dumps({"category": q.category, "prompt": q.turns[0]}) + "\n")
PY
    (sha256sum "$gguf" | cut -d' ' -f1) > runs/cuda4/model.gguf.sha256
    du -sh runs/cuda[1-4]
    ;;
rehearse)  # the run step's validation here, on the CPU, with MLX hidden as on the device machine
    mkdir -p runs/cuda && cat runs/cuda[1-4]/model.gguf.part* > runs/cuda/model.gguf
    ./dev.sh python - --model runs/cuda/model.gguf --adapter "${2:-chat}" --device cpu \
        --prompts "runs/cuda1/prompts_${3:-chat}.jsonl" --limit 2 --max-tokens 16 \
        --out runs/cuda_rehearsal.json <<'PY'
import runpy, sys
sys.modules.update(dict.fromkeys(["mlx", "mlx.core", "mlx.nn", "mlx_lm"]))
sys.argv[0] = "validate_cuda"
runpy.run_module("convert.validate_cuda", run_name="__main__")
PY
    ;;
run)
    adapter=${2:-chat}
    out=${OUT:-runs}
    mkdir -p runs/cuda
    cat runs/cuda[1-4]/model.gguf.part* > runs/cuda/model.gguf
    echo "$(cat runs/cuda4/model.gguf.sha256)  runs/cuda/model.gguf" | sha256sum -c -
    python3 -c 'import gguf' 2>/dev/null || python3 -m pip install -q --no-deps --no-index runs/cuda1/wheels/*.whl
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    python3 -m convert.validate_cuda --model runs/cuda/model.gguf --adapter "$adapter" \
        --prompts "runs/cuda1/prompts_${3:-chat}.jsonl" --limit "${LIMIT:-16}" \
        --max-tokens "${MAX_TOKENS:-64}" \
        --out "$out/cuda_${adapter}_${3:-chat}.json"
    ;;
*)
    echo "usage: scripts/cuda_validate.sh prepare | rehearse [ADAPTER [SUITE]] | run [ADAPTER [SUITE]]" >&2
    exit 2
    ;;
esac
