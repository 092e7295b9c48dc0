#!/usr/bin/env bash
# Re-creates a shipped writing-tool adapter (shared mode: LoRA + streams) for the
# default model, and with --baseline also the next-token LoRA baseline trained on the same rows
# with the same budget (the paper's "Baseline"; written to runs/, not shipped).
#
#   scripts/make_task_adapter.sh sql|data2text|summarize [--baseline | --baseline-only]
#   ENGINE=torch LORA_LAYERS=0 OUT=../runs/sql_all scripts/make_task_adapter.sh sql
#
# ENGINE=torch trains the shared adapter with the PyTorch path's trainer (convert/torch_train.py,
# the same recipe and optimizer steps; DEVICE=cpu unless set; about 2x the MLX trainer's speed on
# the Intel dev CPUs, a quarter of it on the AMD one: docs/BENCHMARKS.md) and converts it into OUT;
# its checkpoint sits beside OUT_torch/ (rerun to resume); its LoRA is stored as float16 (`convert
# --lora-dtype float16`: half the file, the same greedy output on 48 dev prompts of each shipped
# tool: docs/BENCHMARKS.md). LORA_LAYERS overrides the task's LoRA depth (0: every block), STEPS its
# optimizer steps (of batch 4), OUT the adapter folder (its README.md is kept). With ENGINE=torch,
# INIT=FOLDER continues that adapter instead of starting afresh (convert.torch_train --init; a
# next-token LoRA folder, the --baseline run's, gives its LoRA alone, the streams fresh), SEED
# picks another draw of the examples (default 0), LR the streams' peak rate (default 3e-3) and
# STREAM_WEIGHT the streams' loss weight against the main stream's 1 (default 0.1, eq. 6: with
# Adam, how much of the shared LoRA's update serves the streams), LORA_LR the LoRA's (default 5e-5; 0 freezes the INIT tool's LoRA: only its streams learn, though
# its answers can still move, the main stream attending to the stream rows); with INIT, DISTILL=N
# first has the INIT tool answer N of the train prompts (`specstream distill --task --adapter`, into
# RUN_DIR, default ../runs; rerun to resume) and trains on those answers instead of the data set's
# references: the text its streams predict at run time.
# Then parent heads (every tool since 2026-12-05): `specstream train --parent-rank PARENT_RANK (128)
# --from` the adapter above on the first PARENT_ROWS rows of the train split (summarize: on the
# tool's own summaries of the first PARENT_ROWS dialogues of distill's seed-0 order, `specstream
# distill --task --adapter`, for its answers do not follow the references; the file is named after
# the adapter's weights, so a retrained tool answers afresh and an interrupted distillation
# resumes), PARENT_STEPS steps of batch 4 at lr 1e-3 (only the heads train, through the adapter's
# frozen LoRA), a draft vocabulary of the 8,192 commonest answer tokens of the whole train split
# (scripts/draft_vocab.py), the LoRA and the parent heads stored as float16 (a convert round trip)
# and the acceptance statistics measured (`calibrate --measure-acceptance --overwrite`, dev items 40-87);
# PARENT_RANK=0 skips it.
# The baseline goes to BASELINE_OUT (default runs/TASK_next_token); LORA_LAYERS sets its LoRA
# depth too (0: every block, as the shipped tools have); with ENGINE=torch it is trained by
# `convert.torch_train --mode next-token` (the same MLX folder; checkpoint beside it, rerun to
# resume; the trainer the shipped tools came from).
# Data: ../shared/data (SPECSTREAM_DATA overrides), each task's train split in the writing tool's
# prompt template. Both runs resume from their .checkpoint/ folder after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
task=${1:?usage: scripts/make_task_adapter.sh sql|data2text|summarize [--baseline | --baseline-only]}
which=${2:-}
case "$task" in
    # steps x batch sized so one run takes about an hour on the 2-core dev machine. sql: 3,000
    # examples with LoRA in every block (shipped with ENGINE=torch: ~50 min alone); data2text
    # (28 min) the same way (docs/BENCHMARKS.md, issue 20); summarize twice as long, 6,000
    # examples (shipped from a GPU, 2026-11-28: its streams gained, its ROUGE held; 750 steps
    # took 72 min here, so ~2.5 h).
    sql) data=sql/train.jsonl steps=750 max_length=320 lora_layers=0 parent=128
        parent_rows=800 parent_steps=200 suite=sql dev=sql/dev.jsonl ;;
    data2text) data=e2e/train.csv steps=750 max_length=256 lora_layers=0 parent=128
        parent_rows=1501 parent_steps=400 suite=e2e dev=e2e/dev.csv ;;  # 1,500 rows + header
    summarize) data=dialogsum/train.jsonl steps=1500 max_length=512 lora_layers=0 parent=128
        parent_rows=463 parent_steps=250 parent_own=1 parent_val=125 suite=dialogsum
        dev=dialogsum/dev.jsonl ;;
    *) echo "unknown task: $task (sql, data2text or summarize)" >&2; exit 2 ;;
esac
lora_layers=${LORA_LAYERS:-$lora_layers}
steps=${STEPS:-$steps}
out=${OUT:-specstream_mlx/adapters/$task}
readme=$(mktemp)  # the folder's README.md (its data's licences) outlives the retraining,
if [ -f "$out/README.md" ]; then cp "$out/README.md" "$readme"; fi  # a failed step's included
restore_readme() { if [ -s "$readme" ]; then mkdir -p "$out" && cp "$readme" "$out/README.md"; fi; rm -f "$readme"; }
trap restore_readme EXIT
common=(--task "$task" --data "$DATA_DIR/$data" --steps "$steps" --batch-size 4
    --max-length "$max_length" --lora-rank 8 --lora-lr 5e-5 --lora-layers "$lora_layers"
    --warmup 10 --seed 0 --overwrite)
train_data=(--task "$task" --data "$DATA_DIR/$data")
if [ -n "${DISTILL:-}" ]; then  # the INIT tool's own answers to DISTILL train prompts
    [ "${ENGINE:-mlx}" = torch ] || { echo "DISTILL=N needs ENGINE=torch" >&2; exit 2; }
    own=${RUN_DIR:-../runs}/${task}_own.jsonl
    ./dev.sh specstream distill --task "$task" --data-file "$DATA_DIR/$data" \
        --adapter "${INIT:?DISTILL=N needs INIT=the adapter whose answers to learn}" \
        --limit "$DISTILL" --max-tokens 96 --out "$own"
    train_data=(--data "$own")
fi
if [ "$which" != "--baseline-only" ] && [ "${ENGINE:-mlx}" = torch ]; then
    [ -d "${out}_torch" ] || ./dev.sh python -m convert.torch_train --mode shared \
        "${train_data[@]}" --steps "$steps" --batch-size 4 --max-length "$max_length" \
        --n-msa-layers 8 --gamma 4 --lr "${LR:-3e-3}" --lora-lr "${LORA_LR:-5e-5}" --lora-layers "$lora_layers" \
        --warmup 10 --seed "${SEED:-0}" --checkpoint-every 25 --device "${DEVICE:-cpu}" \
        --stream-weight "${STREAM_WEIGHT:-0.1}" \
        ${INIT:+--init "$INIT"} --out "${out}_torch"
    ./dev.sh specstream convert --from "${out}_torch" --to "$out" --overwrite --lora-dtype float16
elif [ "$which" != "--baseline-only" ]; then
./dev.sh specstream train --mode shared "${common[@]}" --out "$out" \
    --gamma 4 --msa-layers 8 --tree-top-k 3 --lr 3e-3 --val-every 250 --checkpoint-every 25
fi
if [ "$which" != "--baseline-only" ]; then
# The shipped default tree (fastest measured on dev-cpu, docs/BENCHMARKS.md): k=1, 2 nodes.
./dev.sh python - "$out" <<'PY'
import json, sys
p = f"{sys.argv[1]}/adapter_config.json"
c = json.load(open(p))
c["stream_config"].update(top_k=1, max_tree_nodes=2)
open(p, "w").write(json.dumps(c, indent=2) + "\n")
PY
if [ "${PARENT_RANK:-$parent}" != 0 ]; then
    run=${RUN_DIR:-../runs}
    mkdir -p "$run"
    if [ -n "${parent_own:-}" ]; then  # the tool's own answers: the text its streams predict
        own=$run/${task}_parent_own_$(sha256sum "$out/adapters.safetensors" | cut -c1-12).jsonl
        ./dev.sh specstream distill --task "$task" --data-file "$DATA_DIR/$data" \
            --adapter "$out" --limit "${PARENT_ROWS:-$parent_rows}" --max-tokens 96 --out "$own"
        parent_data=(--data "$own")
    else
        rows=$run/${task}_parent_rows.${data##*.}
        head -n "${PARENT_ROWS:-$parent_rows}" "$DATA_DIR/$data" > "$rows"
        parent_data=(--task "$task" --data "$rows")
    fi
    ./dev.sh specstream train --mode shared --parent-rank "${PARENT_RANK:-$parent}" --from "$out" \
        "${parent_data[@]}" --out "$run/${task}_parent" \
        --overwrite --steps "${PARENT_STEPS:-$parent_steps}" --batch-size 4 --segment 64 \
        --lr 1e-3 --warmup 20 --val-every "${parent_val:-100}" --checkpoint-every 25
    ./dev.sh python scripts/draft_vocab.py --adapter "$run/${task}_parent" --task "$task" \
        --data "$DATA_DIR/$data" --size 8192 --out "$run/${task}_vocab" --overwrite
    ./dev.sh specstream convert --from "$run/${task}_vocab" --to "$run/${task}_vocab_torch" --overwrite
    ./dev.sh specstream convert --from "$run/${task}_vocab_torch" --to "$out" --overwrite \
        --lora-dtype float16 --heads-dtype float16
    ./dev.sh specstream calibrate --adapter "$out" --measure-acceptance --overwrite --suite "$suite" \
        --data "$DATA_DIR/$dev" --limit 48 --max-tokens 96
fi
fi
if [ -n "$which" ]; then
    baseline=${BASELINE_OUT:-runs/${task}_next_token}
    mkdir -p "$(dirname "$baseline")"
    if [ "${ENGINE:-mlx}" = torch ]; then  # the same folder from the PyTorch trainer
        [ -d "$baseline" ] || ./dev.sh python -m convert.torch_train --mode next-token \
            --task "$task" --data "$DATA_DIR/$data" --steps "$steps" --batch-size 4 \
            --max-length "$max_length" --lora-lr 5e-5 --lora-layers "$lora_layers" --warmup 10 \
            --seed 0 --checkpoint-every 25 --device "${DEVICE:-cpu}" --out "$baseline"
    else
        ./dev.sh specstream train --mode next-token "${common[@]}" --out "$baseline" \
            --val-every 50 --checkpoint-every 10
    fi
fi
