#!/usr/bin/env bash
# Issue 8: greedy vs sampled speedup and tau on the default model with the shipped chat and sql
# adapters, the same bench command at T = 0, 0.7, 1.0 (docs/BENCHMARKS.md, "Sampling ...").
set -euo pipefail
cd "$(dirname "$0")/.."
for t in 0 0.7 1.0; do
  ./dev.sh specstream bench --overwrite --suite chat --data "${SPECSTREAM_DATA:-../shared/data}" --limit 16 --max-tokens 64 \
    --methods ar,ss,ss+pld --temp $t --json docs/results/sampling_chat_t$t.json \
    --markdown docs/results/sampling_chat_t$t.md
done
for t in 0 0.7 1.0; do
  ./dev.sh specstream bench --overwrite --suite sql --data "${SPECSTREAM_DATA:-../shared/data}"/sql/dev.jsonl --limit 20 --max-tokens 64 \
    --methods ar,ss,ss+pld --temp $t --json docs/results/sampling_sql_t$t.json \
    --markdown docs/results/sampling_sql_t$t.md
done
echo DONE
