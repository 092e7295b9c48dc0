#!/usr/bin/env bash
# Trains the Medusa-1 comparator of `specstream bench` (issue 5) on the same data and budget as
# a shipped adapter (steps, batch, sequence length), on the frozen default model. The heads are
# not shipped (4 x 28M parameters, 450 MB in float32): they go to runs/medusa_NAME.
#
#   scripts/make_medusa.sh chat|sql|data2text|summarize
#
# chat needs runs/chat_distill.jsonl (scripts/make_chat_adapter.sh writes it). Resumes from
# runs/medusa_NAME.checkpoint/ after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
name=${1:?usage: scripts/make_medusa.sh chat|sql|data2text|summarize}
case "$name" in
    chat) data=(--data runs/chat_distill.jsonl) steps=600 max_length=512 segment=32 ;;
    sql) data=(--task sql --data "$DATA_DIR/sql/train.jsonl") steps=120 max_length=320 segment=0 ;;
    data2text) data=(--task data2text --data "$DATA_DIR/e2e/train.csv") steps=150 max_length=256 segment=0 ;;
    summarize) data=(--task summarize --data "$DATA_DIR/dialogsum/train.jsonl") steps=100 max_length=512 segment=0 ;;
    *) echo "unknown name: $name (chat, sql, data2text or summarize)" >&2; exit 2 ;;
esac
mkdir -p runs
# Medusa-1's recipe: 4 heads, AdamW at 1e-3; the adapter's steps, batch 4 and sequence length.
./dev.sh specstream train --mode medusa "${data[@]}" --out "runs/medusa_$name" --gamma 4 \
    --tree-top-k 1 --steps "$steps" --batch-size 4 --max-length "$max_length" \
    --segment "$segment" --lr 1e-3 --warmup 10 --val-every 50 --checkpoint-every 25 --seed 0 \
    --overwrite
