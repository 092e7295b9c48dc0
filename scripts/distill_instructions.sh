#!/usr/bin/env bash
# The default model's greedy answers for the train part of the instruction prompts
# (../shared/data/instructions/instructions.jsonl without its fixed dev slice, see
# specstream_mlx/training/instructions.py), as training data for the `chat` streams. It runs in
# the background at the lowest CPU priority and takes hours on the 2-core dev machine; run this
# script again at any time to continue where the output stops (rows already there are skipped).
#
#   scripts/distill_instructions.sh              # start, or resume; returns at once
#   SPLIT=dev scripts/distill_instructions.sh    # the dev slice's answers (449 rows), for validation
#
# which runs, from the repository root:
#   nohup nice -n 19 ./dev.sh specstream distill --instructions --split train \
#       --data-dir ../shared/data --max-tokens 160 --batch-size 32 \
#       --out ../runs/distill/instructions_train.jsonl >> ../runs/distill/log.txt 2>&1 &
#   echo $! > ../runs/distill/pid
#
# Files, outside the repository: ../runs/distill/instructions_$SPLIT.jsonl (one row per prompt:
# prompt, completion, source, category, tokens, capped, loop, loop_tail, degenerate), log.txt (one
# line per batch of rows: counts, rows/s, answer tokens/s, ETA) and pid. While timing something:
#   kill -STOP "$(cat ../runs/distill/pid)"   ...   kill -CONT "$(cat ../runs/distill/pid)"
# Stop it with kill "$(cat ../runs/distill/pid)": written rows stay; the answers in flight are lost
# and generated again on the next run. Keep --max-tokens the same across runs (rows record
# `capped`). One distillation runs at a time (the PID file says which). Settings: SPLIT (train or
# dev), SPECSTREAM_DATA, RUN_DIR, MAX_TOKENS, BATCH_SIZE, LIMIT (the first N prompts of the split;
# default all), FOREGROUND=1 (run here, with a progress bar on a terminal), ENGINE=torch (the
# PyTorch path's distiller, batches of BATCH_SIZE_TORCH=64 similar-length prompts, one log line
# a batch: the same rows, about 3x the MLX distiller's rate on the 2-core dev CPU;
# docs/CORPUS.md).
#
# The answers outlive the machine only in the repository: before it starts, this script appends
# to the output the rows already kept in corpus/smollm2-135m-instruct/ (scripts/corpus.py
# unpack), so it resumes after them; after a run, `./dev.sh python scripts/corpus.py pack
# --split $SPLIT` writes the new rows as the next shard, to commit (docs/CORPUS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
RUN_DIR=${RUN_DIR:-../runs/distill}
SPLIT=${SPLIT:-train}
MAX_TOKENS=${MAX_TOKENS:-160}
BATCH_SIZE=${BATCH_SIZE:-32}
mkdir -p "$RUN_DIR"
RUN_DIR=$(cd "$RUN_DIR" && pwd)
OUT=$RUN_DIR/instructions_$SPLIT.jsonl
PID_FILE=$RUN_DIR/pid

if [ -f "$PID_FILE" ]; then
    pid=$(cat "$PID_FILE")
    if kill -0 "$pid" 2>/dev/null && grep -q distill "/proc/$pid/cmdline" 2>/dev/null; then
        echo "distill_instructions.sh: already running as PID $pid (paused if state is T:" \
            "$(ps -o stat= -p "$pid"))" >&2
        exit 1
    fi
fi

./dev.sh python scripts/corpus.py unpack --split "$SPLIT" --rows "$OUT" --data-dir "$DATA_DIR"

cmd=(./dev.sh specstream distill --instructions --split "$SPLIT" --data-dir "$DATA_DIR"
    --max-tokens "$MAX_TOKENS" --batch-size "$BATCH_SIZE" --out "$OUT")
if [ "${ENGINE:-mlx}" = torch ]; then  # the PyTorch path's distiller (convert/torch_distill.py)
    cmd=(./dev.sh python -m convert.torch_distill --split "$SPLIT" --device "${DEVICE:-cpu}"
        --instructions "$DATA_DIR/instructions/instructions.jsonl" --max-tokens "$MAX_TOKENS"
        --batch-size "${BATCH_SIZE_TORCH:-64}" --out "$OUT")
fi
if [ -n "${LIMIT:-}" ]; then
    cmd+=(--limit "$LIMIT")
fi
if [ "${FOREGROUND:-0}" = 1 ]; then
    exec nice -n 19 "${cmd[@]}"
fi
echo "$(date -u '+%F %T UTC') start: ${cmd[*]}" >> "$RUN_DIR/log.txt"
# nohup, nice and dev.sh each exec the next, so $! is the distilling Python process itself
nohup nice -n 19 "${cmd[@]}" >> "$RUN_DIR/log.txt" 2>&1 < /dev/null &
echo $! > "$PID_FILE"
echo "distilling in the background: PID $! ($PID_FILE), log $RUN_DIR/log.txt, rows $OUT"
