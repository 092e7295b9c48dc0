#!/usr/bin/env bash
# Re-creates Qwen2.5-Coder-0.5B-Instruct's shipped `chat` adapter (lossless streams, issue 19):
# 1. the distilled instruction answers of corpus/ unpacked (SmolLM2's answers: the text only
#    gives contexts, since --targets self makes each stream learn what Qwen itself predicts
#    there, computed in the same frozen forward; distilling Qwen's own answers runs at about
#    13 tokens/s on the 2-core dev machine);
# 2. lossless stream training, resumable (rerun after an interruption): 3,199 s (53 min) on
#    the 2-core dev machine with nothing else running (round 1);
# 3. round 2: Qwen's own greedy answers to the chat mix (`specstream distill --chat-prompts
#    480`: the permissive kinds, 317 distinct prompts; about 36 minutes batched), continuing
#    round 1 for 160 steps (about two epochs, as the sql tool's round 2) with the PyTorch
#    trainer (convert.torch_train --init; about 52 minutes on the dev CPU, DEVICE=cuda on a
#    GPU), converted back (`specstream convert`);
# 4. round 3: Qwen's own answers to a second chat mix (`--chat-prompts 480 --seed 1`: 281 more
#    distinct prompts, appended to round 2's file; about 46 minutes), continuing round 2 for 128
#    steps on all 586 usable rows (about 35 minutes alone on the dev CPU), converted back;
# 5. round 4: Qwen's own answers to a third chat mix (`--chat-prompts 480 --seed 2`: 279 more
#    distinct prompts, appended; about 47 minutes alone), continuing round 3 for 128 steps on
#    all 857 usable rows (about 35 minutes alone), converted back;
# 6. round 5: parent heads on round 4's streams (Qwen's answers to round 2's prompts distilled
#    again, `specstream train --parent-rank 128 --from`), stored as float16;
# 7. its acceptance statistics on the chat suite's items 40-51 (what `calibrate` plans from).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
RUN=${RUN_DIR:-../runs/qwen}
MODEL=qwen2.5-coder-0.5b-instruct
OUT=specstream_mlx/adapters/$MODEL/chat
mkdir -p "$RUN"
for split in train dev; do
    ./dev.sh python scripts/corpus.py unpack --split "$split" \
        --rows "$RUN/instructions_$split.jsonl" --data-dir "$DATA_DIR"
done
./dev.sh python - "$RUN" <<'PY'
import json, os, sys
run = sys.argv[1]
for split, out, n in (("train", "train_all", None), ("dev", "dev100", 100)):
    rows = [r for r in map(json.loads, open(f"{run}/instructions_{split}.jsonl"))
            if not r.get("degenerate")][:n]
    with open(f"{run}/{out}.jsonl.tmp", "w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    os.replace(f"{run}/{out}.jsonl.tmp", f"{run}/{out}.jsonl")
PY
[ -d "$RUN/chat" ] || ./dev.sh specstream train --mode lossless --targets self --model "$MODEL" \
    --data "$RUN/train_all.jsonl" --val "$RUN/dev100.jsonl" --out "$RUN/chat" \
    --gamma 4 --msa-layers 8 --tree-top-k 3 --rank 8 --steps 180 --batch-size 4 --lr 1e-3 \
    --segment 64 --warmup 10 --max-length 320 --val-every 180 --checkpoint-every 15 --seed 0
./dev.sh specstream distill --model "$MODEL" --chat-prompts 480 --max-tokens 128 \
    --batch-size 16 --data-dir "$DATA_DIR" --out "$RUN/chat_own.jsonl"
[ -d "$RUN/chat_own_torch" ] || ./dev.sh python -m convert.torch_train --model "$MODEL" \
    --mode lossless --targets self --data "$RUN/chat_own.jsonl" --init "$RUN/chat" \
    --n-msa-layers 8 --gamma 4 --rank 8 --lr 1e-3 --segment 64 --warmup 10 --steps 160 \
    --max-length 320 --checkpoint-every 25 --device "${DEVICE:-cpu}" --out "$RUN/chat_own_torch"
./dev.sh specstream convert --from "$RUN/chat_own_torch" --to "$RUN/chat_round2" --overwrite
for round in 3 4; do  # a new chat mix (seed round - 2) appended, then 128 steps from the last round
    ./dev.sh specstream distill --model "$MODEL" --chat-prompts 480 --seed $((round - 2)) \
        --max-tokens 128 --batch-size 16 --data-dir "$DATA_DIR" --out "$RUN/chat_own.jsonl"
    [ -d "$RUN/chat_own${round}_torch" ] || ./dev.sh python -m convert.torch_train --model "$MODEL" \
        --mode lossless --targets self --data "$RUN/chat_own.jsonl" \
        --init "$RUN/chat_round$((round - 1))" --n-msa-layers 8 --gamma 4 --rank 8 --lr 1e-3 \
        --segment 64 --warmup 10 --steps 128 --max-length 320 --checkpoint-every 16 \
        --device "${DEVICE:-cpu}" --out "$RUN/chat_own${round}_torch"
    ./dev.sh specstream convert --from "$RUN/chat_own${round}_torch" --to "$RUN/chat_round$round" \
        --overwrite
done
# round 5: parent heads (rank 128) on round 4's frozen streams, on Qwen's own answers to round
# 2's chat-mix prompts distilled again (about 85 minutes batched), 250 steps (about an hour
# here), the heads stored as float16
./dev.sh specstream distill --model "$MODEL" --chat-prompts 480 --seed 0 --max-tokens 128 \
    --batch-size 16 --data-dir "$DATA_DIR" --out "$RUN/chat_parent_rows.jsonl"
[ -d "$RUN/chat_parent" ] || ./dev.sh specstream train --model "$MODEL" --mode lossless \
    --parent-rank 128 --from "$RUN/chat_round4" --data "$RUN/chat_parent_rows.jsonl" \
    --out "$RUN/chat_parent" --steps 250 --batch-size 4 --segment 64 --lr 1e-3 --warmup 20 \
    --draft-vocab 8192 --val-every 125 --checkpoint-every 25 --seed 0
./dev.sh specstream convert --from "$RUN/chat_parent" --to "$RUN/chat_parent_torch" --overwrite
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT.tmp" && ./dev.sh specstream convert --from "$RUN/chat_parent_torch" --to "$OUT.tmp" \
    --heads-dtype float16
# the training data's attribution travels in the folder (README.md, kept from the shipped one)
[ -f "$OUT/README.md" ] && cp "$OUT/README.md" "$OUT.tmp/README.md"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
./dev.sh specstream calibrate --model "$MODEL" --adapter chat --measure-acceptance --overwrite \
    --data "$DATA_DIR" --limit 12 --max-tokens 96
