#!/bin/bash
# Acceptance statistics of the four shipped adapters (their acceptance.json), by greedy decoding
# of dev-split items 40-51 (benchmarks use items 0-39). Run from the repository root.
set -e
D=${SPECSTREAM_DATA:-../shared/data}
./dev.sh specstream calibrate --adapter chat --measure-acceptance --data $D --limit 12 --max-tokens 96
./dev.sh specstream calibrate --adapter summarize --measure-acceptance --data $D/dialogsum/dev.jsonl --limit 12 --max-tokens 96
./dev.sh specstream calibrate --adapter data2text --measure-acceptance --data $D/e2e/dev.csv --limit 12 --max-tokens 96
./dev.sh specstream calibrate --adapter sql --measure-acceptance --data $D/sql/dev.jsonl --limit 12 --max-tokens 96
