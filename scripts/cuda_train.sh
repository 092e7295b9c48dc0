#!/usr/bin/env bash
# Train adapters with the PyTorch path on a lent GPU machine (the device tool) and bring them
# back for MLX: the workflow the project promises (issue 20, item 6; issue 19, item 3 for
# Qwen). The machine has torch, transformers and peft but no network, and takes 64 MiB a call
# with the ~23 MB working tree, so the model's GGUF travels in the parts of
# scripts/cuda_validate.sh (the default model: 3, MODEL=qwen2.5-coder-0.5b-instruct: 14) and the
# tasks' train splits, gzipped, in runs/cudadata, one call each:
#
#   here:         [MODEL=NAME] scripts/cuda_train.sh prepare    # runs/cuda1..N, runs/cudadata
#   device calls: carry ["runs/cudadata"], then ["runs/cuda1"], ... each part but the last,
#                 command "true", each within 30 s of the last
#   device call:  carry ["runs/cudaN"], command "bash scripts/cuda_train.sh run sql data2text"
#   here:         scripts/cuda_train.sh import FILES_AT    # ../runs/gpu/TASK, MLX adapters
#
# then score them as their CPU-trained peers (docs/BENCHMARKS.md): acceptance with
# `specstream calibrate --adapter ../runs/gpu/sql --measure-acceptance --overwrite --data ...`, quality with
# `specstream bench --overwrite --suite sql --adapter ../runs/gpu/sql --methods ar ...`.
#
# Time: on an H200 (2026-11-26, commit 23b03ef) a step of the recipe below took 0.79 s with
# LoRA in every block, the trainer then running one pass per sequence (launch-bound: ~137k aten
# ops a step); packed into one pass per step (~34k ops: benchmarks/torch_train_ops.py), 750
# steps of sql and of data2text with LORA_LAYERS=8 took 79 s each on an H200 (2026-11-27, commit
# 06f7417, max length then 512; 0.105 s a step; the same recipe on the dev CPU: 3,777 and
# 4,985 s), so one call trains the three writing tools.
# A call runs at most 600 s; a run cut short resumes from its checkpoint (kept under runs/ on
# the machine) when the same `run TASK` is called again within the machine's keep-warm window.
#
# `run TASK...` (sql, data2text, summarize, chat; one after another) trains, for the default
# model, the shipped writing tools' recipe (gamma 4, 8 MSA layers, LoRA rank 8 in every block,
# or in the top LORA_LAYERS=8 as the shipped ones, lr 3e-3, LoRA lr 5e-5, STEPS=750 x BATCH=4 =
# 3,000 examples, max length as on the CPU: sql 320, data2text 256, summarize 512, or
# MAX_LENGTH), or for chat the shipped chat's lossless recipe, MSA_LAYERS=16 on the distilled
# instruction answers of corpus/ (lr 3e-3, segment 32, warmup 20, stream rank RANK=8,
# CHAT_STEPS=3000 x 4); for Qwen (sql, chat) the recipe of its shipped adapters
# (scripts/make_qwen_sql_adapter.sh: lossless, --targets self, MSA_LAYERS (8) MSA layers, lr 1e-3,
# segment 64, max length 320) for STEPS / CHAT_STEPS. It writes each PyTorch adapter folder, tarred, to
# $OUT/TASK_torch.tar (a call returns at most 8 files), its log to $OUT/TASK_train.log; a task
# whose adapter is already on the machine is not trained again. The data files are the
# project's ../shared/data, carried for the run only (never committed). `rehearse TASK` runs
# `run` here on the CPU: 2 steps x 2, into runs/.
#
# `BASELINE=1 run TASK...` (writing tools) trains each task's next-token LoRA baseline instead
# (convert.torch_train --mode next-token: the same rows, steps, batch, max length, LoRA rank and
# rate, LORA_LAYERS as make_task_adapter.sh --baseline-only), written as the MLX next-token
# folder, back as $OUT/TASK_next_token.tar; `import` unpacks it to ../runs/gpu/TASK_next_token
# (`specstream bench --methods ar,lora --lora ../runs/gpu/TASK_next_token`).
#
# `rows TASK NAME:VAR=V[,VAR=V]...` trains variants of TASK's recipe side by side on the one GPU
# (a launch-bound step leaves it idle between kernels), each with its VARs (RANK, MSA_LAYERS,
# CHAT_STEPS, ...) into runs/cuda/train/NAME, its tar and log under $OUT/NAME/: on an H200
# (2026-11-28, commit 5ed12de) two 3,000-step chat rows side by side (rank 32; 16 MSA layers)
# took 304 and 333 s: ~19 steps/s together, against ~14 for the 12-layer rank-8 recipe alone
# (0.073 s a step, the fifth lease). A call returns at most 8 files: 3 rows.
#
# `own TASK` (MODEL=qwen2.5-coder-0.5b-instruct; sql) makes the shipped Qwen adapter's next
# round on the GPU: the model's own greedy answers to the first OWN (1100) prompts of the task's
# train split in the seeded order `specstream distill --task` draws (convert/torch_distill.py
# --task), then the shipped adapter continued on them for STEPS (250) x BATCH (4) with its
# recipe (--init; lossless, --targets self); back as $OUT/TASK_torch.tar (`import` converts it)
# and $OUT/TASK_own.jsonl.gz. Rehearsed on the CPU with `DEVICE=cpu TORCH_PYTHON="./dev.sh
# python" OWN=2 STEPS=1 BATCH=1 OUT=runs/cuda_own_rehearsal bash scripts/cuda_train.sh own sql`.
#
# `distill` (the default model; after `prepare`, carrying runs/cudadata and the model's parts as
# for `run`) answers the instruction prompts of the train split that corpus/ lacks with
# convert/torch_distill.py (batched greedy `generate`, DISTILL_BATCH=128 prompts a batch;
# MAX_NEW: at most N of them), and returns only the new rows, gzipped, as
# $OUT/instructions_train_gpu.jsonl.gz; `import FOLDER` here packs them as the next shard of
# corpus/ (docs/CORPUS.md: record it as GPU-made). Rehearsed on the CPU with
# `DEVICE=cpu TORCH_PYTHON="./dev.sh python" MAX_NEW=N OUT=runs/cuda_distill_rehearsal`.
# `MIX=N [SEED=S] distill` answers N prompts of the chat suite's mix over the train splits
# instead (torch_distill --chat-mix: passages, meaning representations, SQL questions, which
# the instruction answers lack; DialogSum's dialogues only with MIX_KINDS=all: their licence is
# non-commercial), into runs/cuda/distill/mix_train.jsonl on the
# machine and $OUT/mix_train_gpu.jsonl.gz here; `CHAT_EXTRA=FILE` adds a file's rows to chat's
# training answers (`rows chat base: mix:CHAT_EXTRA=runs/cuda/distill/mix_train.jsonl`; run the
# distill and the rows in one call: a machine handed back between calls loses the mix file, and
# a missing CHAT_EXTRA stops the row). `import FOLDER` unpacks a returned mix_train_gpu.jsonl.gz
# to $GPU_DIR/mix_train.jsonl. The 4,156 mix answers already distilled (corpus shards mix-00001
# to mix-00004, `--chat-mix 2000 --seed 0`, `1`, `2` and `3`) travel in runs/cudadata: `rows chat
# mix:CHAT_EXTRA=runs/cudadata/instructions/mix_train.jsonl.gz` needs no distill call (a
# CHAT_EXTRA may be gzipped; CHAT_EXTRA_REPEAT=N repeats its rows N times: the 3,525 usable mix
# answers are about 23% of the usable rows once, 75% ten times; the shipped chat's continuation
# trained on half mix (seed 0's 1,020, then seeds 0 and 1's 1,941), half instruction answers).
# runs/cudadata is ~12 MB with WikiText's train split: carry it in a call of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

files() {  # TASK -> the train file under runs/cuda/data
    case $1 in
    sql) echo sql/train.jsonl ;;
    data2text) echo e2e/train.csv ;;
    summarize) echo dialogsum/train.jsonl ;;
    chat) echo instructions/train.jsonl ;;
    wikitext) echo wikitext2/train.txt ;;  # the chat mix's passages (distill MIX=N)
    *)
        echo "unknown task $1 (sql, data2text, summarize, chat)" >&2
        exit 2
        ;;
    esac
}

needs() {  # N USAGE ARGS...: at least N arguments (the subcommand counted), or the usage
    local n=$1 usage=$2
    shift 2
    [ $# -ge "$n" ] || { echo "usage: scripts/cuda_train.sh $usage" >&2; exit 2; }
}

max_length() {  # TASK -> the CPU recipe's max length (scripts/make_task_adapter.sh; chat's)
    case $1 in
    sql) echo 320 ;;
    data2text) echo 256 ;;
    *) echo 512 ;;
    esac
}

train() {  # TASK OUT DEVICE STEPS BATCH PYTHON...
    local task=$1 out=$2 device=$3 steps=$4 batch=$5
    shift 5
    # the writing tools' shared recipe, or for chat the lossless msa12 row's (BENCHMARKS, "What
    # limits the lossless streams") on every distilled instruction answer, for more steps
    local recipe=(--task "$task" --mode shared --n-msa-layers 8 --lr 3e-3 --lora-lr 5e-5
        --lora-layers "${LORA_LAYERS:-0}")
    [ "$task" != chat ] || recipe=(--mode lossless --n-msa-layers "${MSA_LAYERS:-16}" --lr 3e-3
        --segment 32 --warmup 20 --rank "${RANK:-8}")
    local length=${MAX_LENGTH:-$(max_length "$task")} data
    data="runs/cuda/data/$(files "$task")"
    if [ "$task" = chat ] && [ -n "${CHAT_EXTRA:-}" ]; then  # more answers, e.g. the chat mix's
        # checked here: a failure inside an && list does not stop the script (set -e), and the
        # row would train on the base data alone while reporting success
        [ -f "$CHAT_EXTRA" ] || { echo "CHAT_EXTRA=$CHAT_EXTRA: no such file" >&2; exit 2; }
        mkdir -p "$out"
        {  # either may be gzipped; CHAT_EXTRA_REPEAT=N: its rows N times (oversampled)
            zcat -f "$data"
            for _ in $(seq "${CHAT_EXTRA_REPEAT:-1}"); do zcat -f "$CHAT_EXTRA"; done
        } > "$out/chat_train.jsonl"
        data=$out/chat_train.jsonl
    fi
    if [ -n "${BASELINE:-}" ]; then  # the next-token LoRA alone, as make_task_adapter.sh's
        [ "$task" != chat ] || { echo "BASELINE=1: a writing tool's baseline (not chat)" >&2; exit 2; }
        "$@" -m convert.torch_train --mode next-token --task "$task" --data "$data" \
            --steps "$steps" --batch-size "$batch" --max-length "$length" --lora-lr 5e-5 \
            --lora-layers "${LORA_LAYERS:-0}" --warmup 10 --seed 0 --device "$device" \
            --out "$out/${task}_next_token" --overwrite
        return
    fi
    if [ "$(cat runs/cuda1/model.txt)" != smollm2-135m-instruct ]; then  # Qwen's shipped recipe
        recipe=(--mode lossless --targets self --n-msa-layers "${MSA_LAYERS:-8}" --lr 1e-3 --segment 64
            --warmup 10)
        [ "$task" = chat ] || recipe=(--task "$task" "${recipe[@]}")
        length=${MAX_LENGTH:-320}
    fi
    "$@" -m convert.torch_train --model runs/cuda/model.gguf --data "$data" \
        --gamma 4 --steps "$steps" --batch-size "$batch" --max-length "$length" "${recipe[@]}" \
        --device "$device" --out "$out/${task}_torch" --overwrite
}

unpack() {  # TASK: its train file from runs/cudadata to runs/cuda/data, once
    local f
    f=$(files "$1")
    [ -f "runs/cuda/data/$f" ] && return
    mkdir -p "runs/cuda/data/$(dirname "$f")"
    gunzip -c "runs/cudadata/$f.gz" > "runs/cuda/data/$f.tmp"
    mv "runs/cuda/data/$f.tmp" "runs/cuda/data/$f"
}

case "${1:-}" in
prepare)
    bash scripts/cuda_validate.sh prepare
    data=${SPECSTREAM_DATA:-../shared/data}
    rm -rf runs/cudadata && mkdir -p runs/cudadata/sql runs/cudadata/e2e runs/cudadata/dialogsum
    for task in sql data2text summarize wikitext; do
        f=$(files $task)
        mkdir -p "runs/cudadata/$(dirname "$f")"
        gzip -c "$data/$f" > "runs/cudadata/$f.gz"
    done
    # chat: the distilled answers kept in corpus/, with their prompts (no instructions file there)
    rm -f runs/cuda/instructions_train.jsonl && mkdir -p runs/cuda runs/cudadata/instructions
    ./dev.sh python scripts/corpus.py unpack --split train --data-dir "$data" \
        --rows runs/cuda/instructions_train.jsonl
    gzip -c runs/cuda/instructions_train.jsonl > runs/cudadata/instructions/train.jsonl.gz
    gzip -c "$data/instructions/instructions.jsonl" > runs/cudadata/instructions/prompts.jsonl.gz
    # the chat mix's answers kept in corpus/ (shards mix-00001..00005: seeds 0-4), for CHAT_EXTRA
    rm -f runs/cuda/mix_train.jsonl
    ./dev.sh python scripts/corpus.py unpack --split mix --seed 0,1,2,3,4 --data-dir "$data" \
        --rows runs/cuda/mix_train.jsonl
    gzip -c runs/cuda/mix_train.jsonl > runs/cudadata/instructions/mix_train.jsonl.gz
    du -sh runs/cudadata
    ;;
distill)  # the rest of the instruction prompts' answers, on the GPU (convert/torch_distill.py)
    [ -d runs/cudadata ] || { echo "runs/cudadata is missing: carry it (prepare made it)" >&2; exit 2; }
    out=${OUT:-runs}
    mkdir -p runs/cuda/distill "$out"
    bash scripts/cuda_validate.sh join
    rows=runs/cuda/distill/instructions_train.jsonl
    [ -f "$rows" ] || gunzip -c runs/cudadata/instructions/train.jsonl.gz > "$rows"
    gunzip -c runs/cudadata/instructions/prompts.jsonl.gz > runs/cuda/distill/prompts.jsonl
    if [ -n "${MIX:-}" ]; then  # MIX prompts of the chat mix instead (train splits, SEED)
        for task in sql data2text summarize wikitext; do unpack $task; done
        mix=runs/cuda/distill/mix_train.jsonl
        PYTHONUNBUFFERED=1 ${TORCH_PYTHON:-python3} -m convert.torch_distill --model runs/cuda/model.gguf \
            --chat-mix "$MIX" --seed "${SEED:-0}" ${MIX_KINDS:+--mix-kinds "$MIX_KINDS"} \
            --data runs/cuda/data --out "$mix" \
            --max-tokens 160 --batch-size "${DISTILL_BATCH:-128}" --device "${DEVICE:-cuda}" \
            2>&1 | tee -a "$out/distill.log"
        gzip -c "$mix" > "$out/mix_train_gpu.jsonl.gz"  # train chat on it: CHAT_EXTRA=$mix
        exit 0
    fi
    kept=$(wc -l < "$rows")
    PYTHONUNBUFFERED=1 ${TORCH_PYTHON:-python3} -m convert.torch_distill --model runs/cuda/model.gguf \
        --instructions runs/cuda/distill/prompts.jsonl --split train --out "$rows" \
        --max-tokens 160 --batch-size "${DISTILL_BATCH:-128}" --device "${DEVICE:-cuda}" \
        ${MAX_NEW:+--max-new "$MAX_NEW"} 2>&1 | tee -a "$out/distill.log"
    # only the new rows come back (the rest are in corpus/ already)
    tail -n +"$((kept + 1))" "$rows" | gzip -c > "$out/instructions_train_gpu.jsonl.gz"
    ;;
own)  # TASK: a Qwen adapter's next round on the GPU: the model's own answers, then the shipped
    # adapter continued on them (scripts/make_qwen_sql_adapter.sh's round 2 at OWN prompts)
    needs 2 "own TASK" "$@"
    task=$2
    files "$task" > /dev/null
    [ -d runs/cudadata ] || { echo "runs/cudadata is missing: carry it (prepare made it)" >&2; exit 2; }
    model=$(cat runs/cuda1/model.txt)
    init=specstream_mlx/adapters/$model/$task
    [ -d "$init" ] || { echo "no shipped $task adapter for $model to continue" >&2; exit 2; }
    out=${OUT:-runs}
    trained=${TRAIN_DIR:-runs/cuda/train}
    mkdir -p "$out" runs/cuda/own
    bash scripts/cuda_validate.sh join
    unpack "$task"
    rows=runs/cuda/own/${task}_own.jsonl
    PYTHONUNBUFFERED=1 ${TORCH_PYTHON:-python3} -m convert.torch_distill --model runs/cuda/model.gguf \
        --task "$task" --data-file "runs/cuda/data/$(files "$task")" --limit "${OWN:-1100}" \
        --max-tokens 96 --batch-size "${DISTILL_BATCH:-128}" --device "${DEVICE:-cuda}" \
        --out "$rows" 2>&1 | tee -a "$out/${task}_own.log"
    gzip -c "$rows" > "$out/${task}_own.jsonl.gz"
    [ -f "$trained/${task}_torch/streams.safetensors" ] ||
        PYTHONUNBUFFERED=1 ${TORCH_PYTHON:-python3} -m convert.torch_train --model runs/cuda/model.gguf \
            --mode lossless --targets self --data "$rows" --init "$init" --n-msa-layers 8 \
            --gamma 4 --rank 8 --lr 1e-3 --segment 64 --warmup 10 --steps "${STEPS:-250}" \
            --batch-size "${BATCH:-4}" --max-length 320 --device "${DEVICE:-cuda}" \
            --out "$trained/${task}_torch" --overwrite 2>&1 | tee -a "$out/${task}_train.log"
    tar -C "$trained" -cf "$out/${task}_torch.tar" "${task}_torch"
    ;;
rehearse)  # `run` here, on the CPU: the join, the data and two training steps
    rm -rf runs/cuda/train
    DEVICE=cpu TORCH_PYTHON="./dev.sh python" STEPS=2 CHAT_STEPS=2 BATCH=2 OUT=runs/cuda_train_rehearsal \
        bash "$0" run "${2:-sql}"
    ;;
run)
    shift
    [ $# -gt 0 ] || { echo "usage: scripts/cuda_train.sh run TASK [TASK...]" >&2; exit 2; }
    for task in "$@"; do files "$task" > /dev/null; done  # every name known before any work
    [ -d runs/cudadata ] || { echo "runs/cudadata is missing: carry it (prepare made it)" >&2; exit 2; }
    out=${OUT:-runs}
    trained=${TRAIN_DIR:-runs/cuda/train}
    mkdir -p "$out"
    bash scripts/cuda_validate.sh join
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    for task in "$@"; do
        unpack "$task"
        # The adapter and its checkpoint stay under runs/ (a checkpoint is 31 MB, over what a
        # call brings back, and $OUT is emptied before each call): a task cut by the call's time
        # limit resumes when `run` is called again while the machine is warm. Each finished
        # adapter comes back as one file, $OUT/TASK_torch.tar (a call returns at most 8 files).
        steps=${STEPS:-750}
        [ "$task" != chat ] || steps=${CHAT_STEPS:-3000}
        made=${task}_torch file=streams.safetensors
        [ -z "${BASELINE:-}" ] || made=${task}_next_token file=adapters.safetensors
        [ -f "$trained/$made/$file" ] ||
            train "$task" "$trained" "${DEVICE:-cuda}" "$steps" "${BATCH:-4}" \
                ${TORCH_PYTHON:-python3} 2>&1 | tee -a "$out/${made}_train.log"
        tar -C "$trained" -cf "$out/$made.tar" "$made"
    done
    ;;
rows)
    needs 3 "rows TASK NAME:VAR=V[,VAR=V]..." "$@"
    task=$2
    shift 2
    files "$task" > /dev/null
    for spec in "$@"; do
        [[ $spec =~ ^[A-Za-z0-9_.-]+(:([A-Z_][A-Z0-9_]*=[^,]*(,[A-Z_][A-Z0-9_]*=[^,]*)*)?)?$ ]] || {
            echo "$spec: expected NAME or NAME:VAR=V[,VAR=V] (VAR in capitals)" >&2
            exit 2
        }
    done
    [ -d runs/cudadata ] || { echo "runs/cudadata is missing: carry it (prepare made it)" >&2; exit 2; }
    out=${OUT:-runs}
    bash scripts/cuda_validate.sh join  # once, before the rows share the model and the data
    unpack "$task"
    pids=()
    for spec in "$@"; do
        name=${spec%%:*}
        vars=()
        [ "$spec" = "$name" ] || IFS=, read -ra vars <<< "${spec#*:}"
        mkdir -p "$out/$name"
        # each row's training log is its $out/NAME/TASK_train.log; errors outside it, errors.log
        env "${vars[@]}" TRAIN_DIR="runs/cuda/train/$name" OUT="$out/$name" bash "$0" run "$task" \
            > /dev/null 2> "$out/$name/errors.log" &
        pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    find "$out" -name errors.log -empty -delete
    exit "$failed"
    ;;
import)  # FOLDER: the device call's files; each TASK_torch.tar -> ../runs/gpu/TASK (MLX)
    needs 2 "import FOLDER" "$@"
    from=$2
    to=${GPU_DIR:-../runs/gpu}
    mkdir -p "$to"
    if [ -f "$from/instructions_train_gpu.jsonl.gz" ]; then
        # distilled rows: those no shard holds become the next shard of corpus/ (commit it and
        # record it in docs/CORPUS.md as GPU-made); a local distillation skips them once it
        # unpacks again (scripts/distill_instructions.sh does on every start)
        mkdir -p ../runs/gpu
        gunzip -c "$from/instructions_train_gpu.jsonl.gz" > ../runs/gpu/instructions_train_gpu.jsonl
        ./dev.sh python scripts/corpus.py pack --split train --rows ../runs/gpu/instructions_train_gpu.jsonl
        exit 0
    fi
    if [ -f "$from/mix_train_gpu.jsonl.gz" ]; then  # the chat mix's answers (MIX=N distill)
        gunzip -c "$from/mix_train_gpu.jsonl.gz" > "$to/mix_train.jsonl.tmp"
        mv "$to/mix_train.jsonl.tmp" "$to/mix_train.jsonl"
        echo "$(wc -l < "$to/mix_train.jsonl") chat mix rows in $to/mix_train.jsonl"
        compgen -G "$from/*_torch.tar" > /dev/null || compgen -G "$from/*_next_token.tar" \
            > /dev/null || exit 0
    fi
    for tarball in "$from"/*_next_token.tar; do  # next-token baselines: MLX folders already
        [ -f "$tarball" ] || continue
        tar -C "$to" -xf "$tarball"
        echo "$to/$(basename "$tarball" .tar): next-token LoRA (specstream bench --lora)"
    done
    compgen -G "$from/*_torch.tar" > /dev/null || compgen -G "$from/*_next_token.tar" > /dev/null ||
        { echo "no TASK_torch.tar or TASK_next_token.tar in $from" >&2; exit 2; }
    for tarball in "$from"/*_torch.tar; do
        [ -f "$tarball" ] || continue
        task=$(basename "$tarball" _torch.tar)
        tar -C "$to" -xf "$tarball"
        ./dev.sh specstream convert --from "$to/${task}_torch" --to "$to/$task" --overwrite \
            --lora-dtype float16 --model "${MODEL:-$(cat runs/cuda1/model.txt)}"
    done
    ;;
*)
    echo "usage: scripts/cuda_train.sh prepare | rehearse [TASK] | run TASK [TASK...] | rows TASK NAME:VAR=V... | own TASK | distill | import FOLDER" >&2
    exit 2
    ;;
esac
