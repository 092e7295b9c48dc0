#!/usr/bin/env bash
# Re-creates the shipped `sql` adapter (shared mode: LoRA in every layer + streams) for the
# default model from ../shared/data/sql/train.jsonl, in the sql writing tool's prompt template.
# Resumable from specstream_mlx/adapters/sql.checkpoint/. About 1 h on the 2-core dev machine
# (it shared the cores with another training run when measured).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
./dev.sh specstream train --mode shared --task sql --data "$DATA_DIR/sql/train.jsonl" \
    --out specstream_mlx/adapters/sql --gamma 4 --msa-layers 4 --tree-top-k 3 --steps 120 \
    --batch-size 4 --lr 3e-3 --lora-lr 5e-5 --warmup 10 --max-length 320 --val-every 40 \
    --checkpoint-every 10 --seed 0 --overwrite
# The shipped default tree (fastest measured on dev-cpu, docs/BENCHMARKS.md): k=1, 5 nodes.
./dev.sh python - <<'PY'
import json
p = "specstream_mlx/adapters/sql/adapter_config.json"
c = json.load(open(p))
c["stream_config"].update(top_k=1, max_tree_nodes=5)
open(p, "w").write(json.dumps(c, indent=2) + "\n")
PY
