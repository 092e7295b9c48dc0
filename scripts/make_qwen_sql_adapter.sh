#!/usr/bin/env bash
# Re-creates Qwen2.5-Coder-0.5B-Instruct's shipped `sql` adapter (lossless speculative streams for
# the sql writing tool, issue 19): streams only on the frozen base, each learning what Qwen itself
# predicts (--targets self). Three rounds, each resumable (rerun after an interruption):
#   1. on the sql training rows (the data set's reference queries) in the writing tool's prompt
#      template, 150 steps of batch 4 with the MLX trainer (about 40 minutes on the 2-core dev
#      machine with nothing else running);
#   2. on Qwen's own greedy answers to the first OWN (default 541) training prompts of the seeded
#      order (`specstream distill --model ... --task sql`, batched: about 35 minutes), continuing
#      round 1 for 250 more steps with the PyTorch trainer (convert.torch_train --init; about 55
#      minutes on the dev CPU, DEVICE=cuda on a GPU), converted back (`specstream convert`);
#   3. parent heads (rank 128: each stream reads the token before its target) on round 2's frozen
#      streams, trained on Qwen's own answers to the first PARENT_ROWS (default 586) prompts (the
#      same file, extended), 250 steps of batch 4 with the MLX trainer (`specstream train
#      --parent-rank 128 --from`: about 45 minutes on the AMD dev CPU), drafting from the answers'
#      commonest tokens (`--draft-vocab 8192` keeps at most 8,192: 1,226 are all there are).
# Then its acceptance statistics on the sql dev items 40-87 (what `calibrate` plans from). A
# shared-mode adapter (LoRA + streams, the SmolLM2 writing tools' recipe) was tried first and not
# shipped: docs/BENCHMARKS.md, "Qwen2.5-Coder-0.5B: the sql writing tool".
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
RUN=${RUN_DIR:-../runs/qwen}
MODEL=qwen2.5-coder-0.5b-instruct
OUT=specstream_mlx/adapters/$MODEL/sql
mkdir -p "$RUN"
[ -d "$RUN/sql" ] || ./dev.sh specstream train --mode lossless --targets self --model "$MODEL" \
    --task sql --data "$DATA_DIR/sql/train.jsonl" --out "$RUN/sql" \
    --gamma 4 --msa-layers 8 --tree-top-k 3 --rank 8 --steps 150 --batch-size 4 --lr 1e-3 \
    --segment 64 --warmup 10 --max-length 320 --val-every 150 --checkpoint-every 15 --seed 0
./dev.sh specstream distill --model "$MODEL" --task sql --data-file "$DATA_DIR/sql/train.jsonl" \
    --limit "${OWN:-541}" --max-tokens 96 --batch-size 16 --out "$RUN/sql_own.jsonl"
[ -d "$RUN/sql_own_torch" ] || ./dev.sh python -m convert.torch_train --model "$MODEL" \
    --mode lossless --targets self --data "$RUN/sql_own.jsonl" --init "$RUN/sql" \
    --n-msa-layers 8 --gamma 4 --rank 8 --lr 1e-3 --segment 64 --warmup 10 --steps 250 \
    --max-length 320 --checkpoint-every 25 --device "${DEVICE:-cpu}" --out "$RUN/sql_own_torch"
[ -d "$RUN/sql_own" ] || ./dev.sh specstream convert --from "$RUN/sql_own_torch" --to "$RUN/sql_own"
./dev.sh specstream distill --model "$MODEL" --task sql --data-file "$DATA_DIR/sql/train.jsonl" \
    --limit "${PARENT_ROWS:-586}" --max-tokens 96 --batch-size 16 --out "$RUN/sql_own.jsonl"
[ -d "$RUN/sql_parent" ] || ./dev.sh specstream train --model "$MODEL" --mode lossless \
    --parent-rank 128 --from "$RUN/sql_own" --data "$RUN/sql_own.jsonl" --out "$RUN/sql_parent" \
    --steps 250 --batch-size 4 --segment 64 --lr 1e-3 --warmup 20 --draft-vocab 8192 \
    --val-every 125 --checkpoint-every 25 --seed 0
# the heads stored as float16 (half their bytes; both runtimes widen them on loading)
./dev.sh specstream convert --from "$RUN/sql_parent" --to "$RUN/sql_parent_torch" --overwrite
rm -rf "$OUT.tmp" && ./dev.sh specstream convert --from "$RUN/sql_parent_torch" --to "$OUT.tmp" \
    --heads-dtype float16
# the training data's attribution travels in the folder (README.md, kept from the shipped one)
[ -f "$OUT/README.md" ] && cp "$OUT/README.md" "$OUT.tmp/README.md"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
./dev.sh specstream calibrate --model "$MODEL" --adapter sql --measure-acceptance --overwrite --suite sql \
    --data "$DATA_DIR/sql/dev.jsonl" --skip 40 --limit 48 --max-tokens 96
