#!/usr/bin/env bash
# Re-creates the shipped `chat` adapter (lossless) for the default model, from scratch:
# 1. the base model's own greedy answers to 640 varied prompts built from ../shared/data
#    (541 distinct; resumable: rerun after an interruption);
# 2. lossless stream training on them (resumable from specstream_mlx/adapters/chat.checkpoint/).
# On the 2-core dev machine: about 40 min for step 1 and about 80 min for step 2 (sharing the
# cores with another training run).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
mkdir -p runs
./dev.sh specstream distill --chat-prompts 640 --seed 0 --data-dir "$DATA_DIR" \
    --max-tokens 160 --batch-size 32 --out runs/chat_distill.jsonl
./dev.sh specstream train --data runs/chat_distill.jsonl --out specstream_mlx/adapters/chat \
    --gamma 4 --msa-layers 8 --tree-top-k 3 --rank 8 --steps 600 --batch-size 4 --lr 3e-3 \
    --segment 32 --warmup 20 --max-length 512 --val-every 100 --checkpoint-every 25 --seed 0 \
    --overwrite
# The shipped default tree (fastest measured on dev-cpu, docs/BENCHMARKS.md): k=1, 2 nodes.
./dev.sh python - <<'PY'
import json
p = "specstream_mlx/adapters/chat/adapter_config.json"
c = json.load(open(p))
c["stream_config"].update(top_k=1, max_tree_nodes=2)
open(p, "w").write(json.dumps(c, indent=2) + "\n")
PY
