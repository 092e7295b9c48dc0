#!/usr/bin/env bash
# Issue 9: this device's latency curve, the step profile (eager vs compiled), the tuned trees
# against plain decoding and mlx-lm on general prompts and the three app dev splits, and the
# precision table (docs/BENCHMARKS.md, "Hardware tuning"). Run with nothing else on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
D="${SPECSTREAM_DATA:-../shared/data}"
R=docs/results
./dev.sh specstream calibrate --force --adapter chat --json > $R/calibration.json
./dev.sh python benchmarks/step_profile.py --json $R/step_profile.json > $R/step_profile.md
bench() {  # suite data name [extra args]
  ./dev.sh specstream bench --suite "$1" --data "$2" --methods ar,ss,ss+pld,mlx-lm \
    --json $R/tuned_$3.json --markdown $R/tuned_$3.md "${@:4}"
}
for s in "chat $D" "dialogsum $D/dialogsum/dev.jsonl" "e2e $D/e2e/dev.csv" "sql $D/sql/dev.jsonl"; do
  set -- $s
  bench $1 $2 $1 --limit 10 --max-tokens 96
done
# precision table: the same 6 SQL prompts, 64 tokens, float32 / q8 / the GGUF's Q4_1 blocks
for p in float32 q8 stored; do
  ./dev.sh specstream calibrate --precision $p --adapter sql --json > $R/calibration_sql_$p.json
  bench sql "$D/sql/dev.jsonl" sql_$p --precision $p --limit 6 --max-tokens 64
done
echo DONE
