#!/usr/bin/env bash
# The PyTorch path's CUDA validation on a lent GPU machine (the device tool), which has torch,
# transformers and peft but no MLX, no network, and takes at most 64 MiB per call, the working
# tree included (23 MB: the writing tools' every-block LoRA is stored as float16; 37 MB while it
# was float32, when the parts were 25 MB). A model's GGUF therefore travels in parts of
# PART_BYTES (36 MB; the default model: 3 parts, MODEL=qwen2.5-coder-0.5b-instruct: 14), one per call, the calls
# made within the machine's 30 s keep-warm window (ignored paths a call carries stay there for
# the next):
#
#   here:        [MODEL=NAME] scripts/cuda_validate.sh prepare   # runs/cuda1..N, N printed; cuda1
#                                       # also holds the gguf wheel, the prompts, the model's name
#                                       # and its sha256
#   device call: carry ["runs/cuda1"], command "true"   (likewise each part but the last)
#   device call: carry ["runs/cudaN"], command "bash scripts/cuda_validate.sh run chat"
#
# `run ADAPTER [SUITE]` (SUITE: chat, sql, e2e or dialogsum; 16 prompts each, as the bench
# reads them; ADAPTER: a shipped adapter of the prepared model, or a folder) joins the parts,
# checks their sha256, installs the `gguf` reader from the carried wheel (offline) and writes
# $OUT/cuda_ADAPTER_SUITE.json (the bench schema), the markdown table on stdout. `join` does the
# first steps alone (scripts/cuda_train.sh runs it). TREES=4,8,16,32 adds ss@N and ss+pld@N:
# the adapter's draft tree sized to N nodes (convert/validate_cuda.py sized_tree; a shipped
# adapter's own tree is the 2-node one the MLX runtime starts from before its planner picks one
# for the device, and the leases before 2026-11-28 measured only that on the GPU), into
# cuda_ADAPTER_SUITE_trees.json; such a run holds ar, ss and ss+pld as well, so a lease needs no
# plain run beside it. Rehearse it here with `[TREES=4,8] [LIMIT=N] scripts/cuda_validate.sh
# rehearse ADAPTER SUITE` (CPU, MLX hidden).
set -euo pipefail
cd "$(dirname "$0")/.."
PART_BYTES=${PART_BYTES:-36000000}

join_model() {  # runs/cuda/model.gguf from the carried parts, checked; the gguf reader installed
    local sum
    sum="$(cat runs/cuda1/model.gguf.sha256)  runs/cuda/model.gguf"
    mkdir -p runs/cuda
    if ! echo "$sum" | sha256sum -c --status - 2>/dev/null; then  # joined already: leave it
        # shellcheck disable=SC2046  # part paths have no spaces
        cat $(ls runs/cuda[0-9]*/model.gguf.part* | sort -V) > runs/cuda/model.gguf.tmp
        mv runs/cuda/model.gguf.tmp runs/cuda/model.gguf
    fi
    echo "$sum" | sha256sum -c - ||
        { echo "the parts do not make $(cat runs/cuda1/model.txt): carry every runs/cudaK" >&2; exit 2; }
    ${TORCH_PYTHON:-python3} -c 'import gguf' 2>/dev/null ||
        python3 -m pip install -q --no-deps --no-index runs/cuda1/wheels/*.whl
}

adapter_folder() {  # NAME -> a shipped adapter of the prepared model (the default's: by name)
    local model shipped=specstream_mlx/adapters
    model=$(cat runs/cuda1/model.txt)
    if [ -d "$1" ]; then echo "$1"
    elif [ -d "$shipped/$model/$1" ]; then echo "$shipped/$model/$1"
    else echo "$1"; fi
}

case "${1:-}" in
prepare)
    model=${MODEL:-smollm2-135m-instruct}
    gguf=$(./dev.sh python -c "from specstream_mlx.models.packaged import packaged_gguf; print(packaged_gguf('$model'))")
    size=$(stat -c %s "$gguf")
    n=$(((size + PART_BYTES - 1) / PART_BYTES))
    rm -rf runs/cuda runs/cuda[0-9]* && mkdir -p runs/cuda runs/cuda1/wheels
    split -n "$n" -d -a 2 --numeric-suffixes=1 "$gguf" runs/cuda/part
    for i in $(seq 1 "$n"); do
        mkdir -p "runs/cuda$i" && mv "runs/cuda/part$(printf %02d "$i")" "runs/cuda$i/model.gguf.part$i"
    done
    echo "$model" > runs/cuda1/model.txt
    (sha256sum "$gguf" | cut -d' ' -f1) > runs/cuda1/model.gguf.sha256
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
    du -sh runs/cuda[0-9]* | sort -V -k2
    echo "$model in $n parts: carry runs/cuda1 .. runs/cuda$n, one a call, the last with the command"
    ;;
rehearse)  # the run step's validation here, on the CPU, with MLX hidden as on the device machine
    TORCH_PYTHON="./dev.sh python" join_model
    ./dev.sh python - --model runs/cuda/model.gguf --adapter "$(adapter_folder "${2:-chat}")" \
        --device cpu --prompts "runs/cuda1/prompts_${3:-chat}.jsonl" --limit "${LIMIT:-2}" \
        --max-tokens 16 ${TREES:+--trees "$TREES"} --out runs/cuda_rehearsal.json <<'PY'
import runpy, sys
sys.modules.update(dict.fromkeys(["mlx", "mlx.core", "mlx.nn", "mlx_lm"]))
sys.argv[0] = "validate_cuda"
runpy.run_module("convert.validate_cuda", run_name="__main__")
PY
    ;;
join)
    join_model
    ;;
run)
    adapter=${2:-chat}
    out=${OUT:-runs}
    join_model
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    python3 -m convert.validate_cuda --model runs/cuda/model.gguf \
        --adapter "$(adapter_folder "$adapter")" \
        --prompts "runs/cuda1/prompts_${3:-chat}.jsonl" --limit "${LIMIT:-16}" \
        --max-tokens "${MAX_TOKENS:-64}" ${TREES:+--trees "$TREES"} \
        --out "$out/cuda_$(basename "$adapter")_${3:-chat}${TREES:+_trees}.json"  # a folder: its last name
    ;;
*)
    echo "usage: [MODEL=NAME] scripts/cuda_validate.sh prepare | rehearse [ADAPTER [SUITE]] | join | run [ADAPTER [SUITE]]" >&2
    exit 2
    ;;
esac
