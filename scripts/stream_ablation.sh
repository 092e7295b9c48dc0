#!/usr/bin/env bash
# Issue 20's curves and ablations for the lossless `chat` streams, one row at a time, each a
# resumable `specstream train` run on the distilled instruction answers (corpus/, unpacked into
# ../runs/distill by scripts/corpus.py) scored on the same 300 dev answers by
# benchmarks/validate_streams.py. Every row has the same budget unless its name says otherwise:
# gamma 4, 8 MSA layers, stream-adapter rank 8, 400 steps of batch 4, lr 3e-3, segment 32.
#
#   scripts/stream_ablation.sh                 # every row, in order (hours: ~35 min of training
#                                              # and ~10 min of scoring per row on dev-cpu)
#   ROWS="n1000 n3000" scripts/stream_ablation.sh
#   DRY_RUN=1 scripts/stream_ablation.sh       # the commands, nothing run
#
# Rows: n1000 / n3000 / n10000: the first N usable training answers, fixed step budget (data
# curve; a row whose N exceeds what is distilled is skipped with a message); e1000 / e3000:
# 1,000 / 3,000 answers for 2 epochs (500 / 1,500 steps: the curve at a fixed epoch count),
# both trained by the PyTorch path on the CPU as msa12long is (below). The ablations change one thing of n1000,
# the row they compare with (n1000's streams fit their own training answers hardly better than
# dev answers: docs/BENCHMARKS.md, so data is not what they vary): soft: --targets soft; r32,
# r64: stream-adapter rank 32 / 64 (r64 at lr 3e-3 did not train: its streams' output moves 8x
# as fast a step as rank 8's, the adapter having no 1/rank scale; r64lr is r64 at 3e-3 x 8/64 =
# 3.75e-4, rank 8's step in the streams' output, though the trainer's one lr also slows the
# stream embeddings and the pruning head: not capacity alone); msa4 .. msa20: 4 / 12 / 16 / 20 MSA layers (r32, r64 and
# msa4 trained by the PyTorch path on the CPU for e1000's 500 steps since 2026-12-07: e1000,
# the same trainer, data and steps, is their reference); msa12x3: msa12
# for 3x the steps (1,200: does training longer help the deeper streams?); attn:
# --attention-adapters (stream adapters on the attention path as well); guess:
# --next-token-guess (the streams start from the early-exit head's guess for the next token).
# medusa: not streams but Medusa-1's 4 heads (each a residual block and its own LM head, 28M
# parameters, on the base's last hidden state), trained on n1000's answers and budget at
# Medusa's lr 1e-3: what full depth reaches. msa12long: msa12 on 10,000 usable answers for
# 2,000 steps (five times the budget), trained by the PyTorch path on the CPU
# (convert/torch_train.py, the same recipe and optimizer steps; 2.8 s a step here against the
# MLX trainer's 8-13) and converted (ROW_torch/ is the PyTorch adapter, its checkpoint beside
# it: rerun to resume).
# Output: ../runs/ablation/ROW/ (the adapter and its checkpoint: rerun to resume) and
# ../runs/ablation/ROW.json (the validation record: per-stream top-1, tau, the acceptance
# counts, training seconds, provenance). A row whose JSON exists is not run again.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${RUN_DIR:-../runs/ablation}
DISTILL=${DISTILL:-../runs/distill}
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
ALL="n1000 n3000 n10000 e1000 soft r32 r64 r64lr msa4 msa12 msa12x3 msa16 msa20 attn guess medusa"
ALL="$ALL msa12long e3000"
ROWS=${ROWS:-$ALL}
DRY_RUN=${DRY_RUN:-0}

run() {
    echo "+ $*"
    [ "$DRY_RUN" = 1 ] || "$@"
}

mkdir -p "$RUN_DIR" "$DISTILL"
if [ "$DRY_RUN" != 1 ]; then  # one script at a time: two would train the same row into one folder
    exec 9>"$RUN_DIR/.lock"
    flock -n 9 || { echo "stream_ablation.sh: another one is running in $RUN_DIR" >&2; exit 2; }
fi
for split in train dev; do
    run ./dev.sh python scripts/corpus.py unpack --split "$split" \
        --rows "$DISTILL/instructions_$split.jsonl" --data-dir "$DATA_DIR"
done

usable() {  # the first $1 rows that training reads (not degenerate) of $2 into $3
    ./dev.sh python - "$1" "$2" "$3" <<'PY'
import json, os, sys
n, src, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = [r for r in map(json.loads, open(src)) if not r.get("degenerate")]
if len(rows) < n:
    sys.exit(f"only {len(rows)} usable rows in {src}, {n} wanted")
with open(out + ".tmp", "w") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:n])
os.replace(out + ".tmp", out)
PY
}

DEV=$RUN_DIR/dev300.jsonl
if [ "$DRY_RUN" != 1 ]; then
    usable 300 "$DISTILL/instructions_dev.jsonl" "$DEV"
fi

for row in $ROWS; do
    n=1000 steps=400 msa=8 rank=8 lr=3e-3 targets=text extra=() trainer=mlx
    case "$row" in
        n1000) ;;
        n3000) n=3000 ;;
        n10000) n=10000 ;;
        e1000) steps=500 trainer=torch ;;
        e3000) n=3000 steps=1500 trainer=torch ;;
        soft) targets=soft ;;
        r32) rank=32 steps=500 trainer=torch ;;
        r64) rank=64 steps=500 trainer=torch ;;
        r64lr) rank=64 lr=3.75e-4 steps=500 trainer=torch ;;
        msa4) msa=4 steps=500 trainer=torch ;;
        msa12) msa=12 ;;
        msa12x3) msa=12 steps=1200 ;;
        msa16) msa=16 ;;
        msa20) msa=20 ;;
        attn) extra=(--attention-adapters) ;;
        guess) extra=(--next-token-guess) ;;
        medusa) ;;
        msa12long) n=10000 msa=12 steps=2000 trainer=torch ;;
        *) echo "stream_ablation.sh: unknown row $row (rows: $ALL)" >&2; exit 2 ;;
    esac
    if [ -f "$RUN_DIR/$row.json" ]; then
        echo "$row: done ($RUN_DIR/$row.json)"
        continue
    fi
    data=$RUN_DIR/train_$n.jsonl
    if [ "$DRY_RUN" != 1 ] && ! usable "$n" "$DISTILL/instructions_train.jsonl" "$data"; then
        echo "$row: skipped (distil more: scripts/distill_instructions.sh)"
        continue
    fi
    if [ "$row" = medusa ]; then  # the full-depth comparator: Medusa-1's 4 heads, its lr
        run ./dev.sh specstream train --mode medusa --data "$data" --val "$DEV" \
            --out "$RUN_DIR/$row" --gamma 4 --tree-top-k 3 --steps "$steps" --batch-size 4 \
            --lr 1e-3 --segment 32 --warmup 20 --max-length 512 --val-every "$steps" \
            --checkpoint-every 25 --seed 0 --quiet
        run ./dev.sh python benchmarks/validate_streams.py --medusa "$RUN_DIR/$row" \
            --data "$DEV" --json "$RUN_DIR/$row.json"
        continue
    fi
    if [ "$trainer" = torch ]; then  # the PyTorch path's trainer, on the CPU, then converted
        [ -d "$RUN_DIR/${row}_torch" ] ||
            run ./dev.sh python -m convert.torch_train --mode lossless --data "$data" \
                --out "$RUN_DIR/${row}_torch" --gamma 4 --n-msa-layers "$msa" --rank "$rank" \
                --steps "$steps" \
                --batch-size 4 --lr "$lr" --segment 32 --warmup 20 --max-length 512 \
                --checkpoint-every 25 --seed 0 --device "${DEVICE:-cpu}"
        run ./dev.sh specstream convert --from "$RUN_DIR/${row}_torch" --to "$RUN_DIR/$row" \
            --overwrite
        run ./dev.sh python benchmarks/validate_streams.py --adapter "$RUN_DIR/$row" \
            --data "$DEV" --json "$RUN_DIR/$row.json"
        continue
    fi
    # training validates on the same dev rows at its last step (recorded in adapter_config.json);
    # validate_streams adds the acceptance counts and the static trees' tau
    run ./dev.sh specstream train --mode lossless --data "$data" --val "$DEV" \
        --out "$RUN_DIR/$row" --gamma 4 --msa-layers "$msa" --tree-top-k 3 --rank "$rank" \
        --targets "$targets" --steps "$steps" --batch-size 4 --lr "$lr" --segment 32 --warmup 20 \
        --max-length 512 --val-every "$steps" --checkpoint-every 25 --seed 0 --quiet \
        ${extra[@]+"${extra[@]}"}
    run ./dev.sh python benchmarks/validate_streams.py --adapter "$RUN_DIR/$row" --data "$DEV" \
        --json "$RUN_DIR/$row.json"
done
