#!/usr/bin/env bash
# A writing tool that keeps its next-token baseline's answers by construction (issue 20): the
# baseline's LoRA, with lossless streams trained on the baseline merged into the model, packed
# into one shared-mode adapter whose main stream ignores its streams (main_reads_streams false;
# docs/training.md, `specstream train`, the `scripts/pack_lora_streams.py` item).
#
#   scripts/make_packed_adapter.sh sql|data2text|summarize
#   OUT=../runs/sql_packed/sql scripts/make_packed_adapter.sh sql
#
# Steps (1-4 skipped when their output exists, so a rerun resumes; the trainers resume from their
# checkpoints too), in RUN_DIR (default ../runs):
#   1. the next-token baseline, every block (BASELINE, default RUN_DIR/baselines/TASK_next_token_all:
#      `make_task_adapter.sh TASK --baseline-only`, the shipped tool's rows and budget; ENGINE=torch
#      trains it with the PyTorch path, the faster one on a GPU and on the Intel dev CPUs);
#   2. merged into the model (scripts/fuse_next_token.py);
#   3. lossless streams on the merged model, on its own greedy tokens (--targets self): the
#      shipped tool's steps and stream settings (4 streams, MSA_LAYERS MSA layers, lr 3e-3);
#   4. parent heads of rank PARENT_RANK on them (`train --from`, the shipped tool's rows and
#      steps; in TASK_lossless_parent at rank 128, else TASK_lossless_parent_rN: sql's 120 too);
#   5. a draft vocabulary of the 8,192 commonest answer tokens of the train split;
#   6. packed (scripts/pack_lora_streams.py) for the untouched base, stored as float16 (a
#      convert round trip), the shipped default tree (k=1, 2 nodes) and the acceptance
#      statistics measured (`calibrate --measure-acceptance`, dev items 40-87) into OUT
#      (default specstream_mlx/adapters/TASK; its README.md is kept).
# ENGINE=torch trains the baseline and the lossless streams with the PyTorch path (DEVICE=cuda on
# a GPU; the parent heads train with MLX either way). STEPS and PARENT_STEPS override the
# optimizer steps (a smoke run: STEPS=2 PARENT_STEPS=2 with RUN_DIR and OUT elsewhere); MSA_LAYERS the streams' depth (the shipped tool's: 12 for sql, 8 for
# data2text and summarize; with another RUN_DIR,
# and BASELINE pointing at a baseline already trained, the baseline is reused; a RUN_DIR whose
# lossless streams have another depth is refused); PARENT_RANK the
# parent heads' rank (the shipped tool's: 120 for sql, 128 for the others; 12 MSA layers with
# rank 128 come to 1,006,848 parameters beside the LoRA, over issue 20's 1e6: rank 120 fits).
# The shipped sql came from RUN_DIR=../runs/sql12, its 8-layer streams kept in ../runs.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
task=${1:?usage: scripts/make_packed_adapter.sh sql|data2text|summarize}
case "$task" in  # as scripts/make_task_adapter.sh
    sql) data=sql/train.jsonl steps=750 max_length=320 parent_rows=800 parent_steps=200
        suite=sql dev=sql/dev.jsonl msa=12 parent_rank=120 ;;
    data2text) data=e2e/train.csv steps=750 max_length=256 parent_rows=1501 parent_steps=400
        suite=e2e dev=e2e/dev.csv msa=8 parent_rank=128 ;;
    summarize) data=dialogsum/train.jsonl steps=1500 max_length=512 parent_rows=463
        parent_steps=250 suite=dialogsum dev=dialogsum/dev.jsonl msa=8 parent_rank=128 ;;
    *) echo "unknown task: $task (sql, data2text or summarize)" >&2; exit 2 ;;
esac
steps=${STEPS:-$steps}
parent_steps=${PARENT_STEPS:-$parent_steps}
msa=${MSA_LAYERS:-$msa}
parent_rank=${PARENT_RANK:-$parent_rank}
run=${RUN_DIR:-../runs}
baseline=${BASELINE:-$run/baselines/${task}_next_token_all}
out=${OUT:-specstream_mlx/adapters/$task}
merged=$run/${task}_merged
mkdir -p "$run"
[ -f "$baseline/adapters.safetensors" ] ||
    LORA_LAYERS=0 BASELINE_OUT="$baseline" scripts/make_task_adapter.sh "$task" --baseline-only
[ -f "$merged/model.safetensors" ] || ./dev.sh python scripts/fuse_next_token.py "$baseline" "$merged"
streams=(--model "$merged" --mode lossless --targets self --segment 64 --batch-size 4
    --checkpoint-every 25 --overwrite)
if [ -f "$run/${task}_lossless/adapters.safetensors" ]; then  # trained: at this depth?
    have=$(./dev.sh python -c 'import json, sys
print(json.load(open(sys.argv[1]))["stream_config"]["n_msa_layers"])' "$run/${task}_lossless/adapter_config.json")
    if [ "$have" != "$msa" ]; then
        echo "make_packed_adapter.sh: $run/${task}_lossless holds streams in $have MSA layers," \
            "not the $msa asked for (MSA_LAYERS; $task's default otherwise): give another RUN_DIR" \
            "(and BASELINE to reuse a baseline)" >&2
        exit 2
    fi
elif [ "${ENGINE:-mlx}" = torch ]; then  # the PyTorch trainer (a GPU: DEVICE=cuda), converted
    ./dev.sh python -m convert.torch_train --mode lossless --model "$merged" --task "$task" \
        --data "$DATA_DIR/$data" --targets self --n-msa-layers "$msa" --gamma 4 --lr 3e-3 \
        --segment 64 --warmup 20 --steps "$steps" --batch-size 4 --max-length "$max_length" \
        --checkpoint-every 25 --device "${DEVICE:-cpu}" --out "$run/${task}_lossless_torch"
    ./dev.sh specstream convert --from "$run/${task}_lossless_torch" \
        --to "$run/${task}_lossless" --model "$merged" --overwrite
else
    ./dev.sh specstream train "${streams[@]}" --task "$task" --data "$DATA_DIR/$data" \
        --gamma 4 --msa-layers "$msa" --tree-top-k 3 --lr 3e-3 --warmup 20 --steps "$steps" \
        --max-length "$max_length" --val-every 250 --out "$run/${task}_lossless"
fi
rows=$run/${task}_parent_rows.${data##*.}
head -n "$parent_rows" "$DATA_DIR/$data" > "$rows"
parent=$run/${task}_lossless_parent
[ "$parent_rank" = 128 ] || parent=${parent}_r$parent_rank
[ -f "$parent/adapters.safetensors" ] ||
    ./dev.sh specstream train "${streams[@]}" --parent-rank "$parent_rank" --from "$run/${task}_lossless" \
        --task "$task" --data "$rows" --steps "$parent_steps" --lr 1e-3 --warmup 20 \
        --val-every 100 --out "$parent"
./dev.sh python scripts/draft_vocab.py --model "$merged" --adapter "$parent" \
    --task "$task" --data "$DATA_DIR/$data" --size 8192 --out "$run/${task}_lossless_vocab" --overwrite
readme=$(mktemp)  # the folder's README.md (its data's licences) outlives the repacking,
if [ -f "$out/README.md" ]; then cp "$out/README.md" "$readme"; fi  # a failed step's included
restore_readme() { if [ -s "$readme" ]; then mkdir -p "$out" && cp "$readme" "$out/README.md"; fi; rm -f "$readme"; }
trap restore_readme EXIT
./dev.sh python scripts/pack_lora_streams.py "$baseline" "$run/${task}_lossless_vocab" \
    "$run/${task}_packed" --overwrite
./dev.sh specstream convert --from "$run/${task}_packed" --to "$run/${task}_packed_torch" --overwrite
./dev.sh specstream convert --from "$run/${task}_packed_torch" --to "$out" --overwrite \
    --lora-dtype float16 --heads-dtype float16
./dev.sh python - "$out" <<'PY'
import json, sys
p = f"{sys.argv[1]}/adapter_config.json"
c = json.load(open(p))
c["stream_config"].update(top_k=1, max_tree_nodes=2)
open(p, "w").write(json.dumps(c, indent=2) + "\n")
PY
./dev.sh specstream calibrate --adapter "$out" --measure-acceptance --overwrite --suite "$suite" \
    --data "$DATA_DIR/$dev" --limit 48 --max-tokens 96
