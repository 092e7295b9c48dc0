#!/bin/bash
# Acceptance statistics of the four shipped adapters (their acceptance.json), by greedy decoding
# of dev-split items from 40 on (benchmarks use items 0-39): enough items for about 1,000
# positions each (sql and data2text answers are short; 12 items gave 92-120 positions, and the
# trees chosen from so few were off: 2026-11-27): 48 items, items 40-87, as every shipped
# SmolLM2 adapter's file records (make_packed_adapter.sh measures a packed one the same way).
# Run from the repository root.
set -e
D=${SPECSTREAM_DATA:-../shared/data}
./dev.sh specstream calibrate --adapter chat --measure-acceptance --overwrite --data $D --limit 48 --max-tokens 96
./dev.sh specstream calibrate --adapter summarize --measure-acceptance --overwrite --data $D/dialogsum/dev.jsonl --limit 48 --max-tokens 96
./dev.sh specstream calibrate --adapter data2text --measure-acceptance --overwrite --data $D/e2e/dev.csv --limit 48 --max-tokens 96
./dev.sh specstream calibrate --adapter sql --measure-acceptance --overwrite --data $D/sql/dev.jsonl --limit 48 --max-tokens 96
