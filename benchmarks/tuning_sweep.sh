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
./dev.sh python benchmarks/step_profile.py --adapter sql --paths "0;1" \
  --json $R/step_profile_sql.json > $R/step_profile_sql.md
bench() {  # suite data name [extra args]
  ./dev.sh specstream bench --overwrite --suite "$1" --data "$2" --methods ar,ss,ss+pld,mlx-lm \
    --json $R/tuned_$3.json --markdown $R/tuned_$3.md "${@:4}"
}
for s in "chat $D" "dialogsum $D/dialogsum/dev.jsonl" "e2e $D/e2e/dev.csv" "sql $D/sql/dev.jsonl"; do
  set -- $s
  bench $1 $2 $1 --limit 10 --max-tokens 96
done
# precision table: 4 SQL prompts, 48 tokens, ar and ss with the adapter's own tree (no
# calibration: on this CPU a quantized model's passes grow with rows, timing them takes minutes)
for p in float32 q8 stored; do
  ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --methods ar,ss --tree adapter \
    --precision $p --limit 4 --max-tokens 48 --json $R/precision_sql_$p.json \
    --markdown $R/precision_sql_$p.md
done
echo DONE
