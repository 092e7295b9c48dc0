#!/usr/bin/env bash
# Re-creates Qwen2.5-Coder-0.5B-Instruct's shipped `sql` adapter (lossless streams for the sql
# writing tool, issue 19): streams only on the frozen base, each learning what Qwen itself
# predicts (--targets self) on the sql training rows in the writing tool's prompt template;
# resumable (rerun after an interruption). About 40 minutes on the 2-core dev machine with
# nothing else running. Then its acceptance statistics on the sql dev items 40-51 (what
# `calibrate` plans from). A shared-mode adapter (LoRA + streams, the SmolLM2 writing tools'
# recipe) was tried first and not shipped: docs/BENCHMARKS.md, "Qwen2.5-Coder-0.5B: the sql
# writing tool".
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
RUN=${RUN_DIR:-../runs/qwen}
MODEL=qwen2.5-coder-0.5b-instruct
OUT=specstream_mlx/adapters/$MODEL/sql
mkdir -p "$RUN"
./dev.sh specstream train --mode lossless --targets self --model "$MODEL" --task sql \
    --data "$DATA_DIR/sql/train.jsonl" --out "$RUN/sql" \
    --gamma 4 --msa-layers 8 --tree-top-k 3 --rank 8 --steps 150 --batch-size 4 --lr 1e-3 \
    --segment 64 --warmup 10 --max-length 320 --val-every 150 --checkpoint-every 15 --seed 0
rm -rf "$OUT.tmp" && cp -r "$RUN/sql" "$OUT.tmp"
# the training data's attribution travels in the folder (README.md, kept from the shipped one)
[ -f "$OUT/README.md" ] && cp "$OUT/README.md" "$OUT.tmp/README.md"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
./dev.sh specstream calibrate --model "$MODEL" --adapter sql --measure-acceptance --suite sql \
    --data "$DATA_DIR/sql/dev.jsonl" --limit 12 --max-tokens 96
