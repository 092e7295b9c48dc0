#!/usr/bin/env bash
# Re-creates the shipped `chat` adapter (lossless) for the default model, from the repository:
# 1. the base model's own greedy answers to the instruction prompts of
#    ../shared/data/instructions, kept in corpus/ (docs/CORPUS.md), unpacked; the usable ones
#    (not degenerate; the first ROWS if set) are the training rows: every usable row of the
#    shards train-00001..00010 (11,486);
# 2. lossless stream training with the PyTorch path's trainer (convert/torch_train.py, the MLX
#    trainer's recipe and optimizer steps): MSA_LAYERS (16) MSA layers, STEPS (3,000) of batch 4,
#    lr 3e-3, segment 32, warmup 20 (msa16, shipped 2026-11-28: trained on an H200,
#    `MSA_LAYERS=16 CHAT_STEPS=3000 bash scripts/cuda_train.sh run chat`, 333 s beside another
#    run; docs/BENCHMARKS.md, "The sixth lease"); here, DEVICE=cuda on a GPU, or on the 2-core
#    dev CPU some 3 hours alone (2.8-3.1 s a step with 12 MSA layers); BASE=FOLDER skips it and
#    continues FOLDER instead (msa16 itself: `git show 84c2efa:specstream_mlx/adapters/chat/...`);
#    MIX_STEPS=0 stops after it (msa16 is then the result), and MSA_LAYERS=12 STEPS=4000
#    ROWS=10185 MIX_STEPS=0 give the one shipped before msa16 (gpu4000); resumable (rerun after
#    an interruption: checkpoints sit beside runs/chat_torch/ and runs/chat_mix_torch/);
# 3. the chat mix continuation: the base model's answers to the chat suite's mix of prompts over
#    the data sets' train splits, kept in corpus/ (shards mix-00001 and mix-00002: `python -m
#    convert.torch_distill --chat-mix 2000 --seed 0`, then `--seed 1`'s new answers; mix-00003,
#    mix-00004 and mix-00005 seeds 2, 3 and 4's); the
#    permissive kinds: WikiText-2 passages, E2E meaning representations, SQL questions and 30
#    written instructions; no DialogSum), unpacked; rounds of MIX_STEPS (900) steps of batch 4
#    at lr 1e-3, warmup 50, the first from step 2's adapter, each next from the last; a round
#    trains on the usable answers of its mix seeds plus as many usable instruction answers drawn
#    at random (seed 0). MIX_SEEDS lists each round's seeds (default "0 0 0,1 0,1,2,3 0,1,2,3,4": two
#    rounds on seed 0's 1,020 answers, a third on both seeds' 1,941, a fourth on the four seeds'
#    3,525, a fifth on the five seeds' 4,222); MIX_ROUNDS=N runs its first N. The shipped `chat`
#    since 2026-12-02 03:25 UTC: BASE=msa16, five rounds (3,704, 3,762, some 4,400, 7,219 and
#    4,547 s of wall time on the 2-core dev CPU, the third beside other work, the fourth paused
#    for timings); MIX_ROUNDS=4 gives the one shipped from 2026-12-01 23:30 UTC to then,
#    MIX_ROUNDS=3 the one shipped from 2026-11-29 08:00 UTC, MIX_ROUNDS=2 the one before it that day,
#    MIX_ROUNDS=1 the one before that, MIX_ROUNDS=1 MIX_STEPS=300 the first;
# 4. conversion to MLX into the shipped folder (its README.md, the data's attribution, kept), the
#    uncalibrated default tree (k=1, 2 nodes: `calibrate` plans the real one from the latency
#    curve) and its acceptance statistics on the chat suite's items 40-87 (40-51 until
#    2026-12-01: too few positions, they promised more than the streams gave; OUT=FOLDER writes
#    there instead of the shipped folder);
# 5. parent heads (since 2026-12-04): `specstream train --parent-rank PARENT_RANK (128) --from`
#    step 4's folder, on the first PARENT_ROWS (400) rows of the unpacked instruction answers
#    (315 usable, 16 held out for validation), PARENT_STEPS (300) steps of batch 4 at lr 1e-3,
#    segment 64, warmup 20: only the heads train, on the streams' frozen states (about 40 min
#    on the 2-core dev CPU beside the test suite), then each head cut to its PARENT_KEEP (112)
#    largest hidden units (within issue 20's 1e6 extra parameters); PARENT_RANK=0 skips it
#    (the five-round `chat` shipped before).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${SPECSTREAM_DATA:-../shared/data}
RUN=${RUN_DIR:-runs}
OUT=${OUT:-specstream_mlx/adapters/chat}  # OUT=FOLDER: a candidate, elsewhere
mkdir -p "$RUN"
./dev.sh python scripts/corpus.py unpack --split train --rows "$RUN/instructions_train.jsonl" \
    --data-dir "$DATA_DIR"
./dev.sh python - "$RUN" <<'PY'
import json, os, sys
run = sys.argv[1]
rows = [r for r in map(json.loads, open(f"{run}/instructions_train.jsonl"))
        if not r.get("degenerate")][:int(os.environ.get("ROWS") or 10**9)]
with open(f"{run}/chat_train.jsonl.tmp", "w") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
os.replace(f"{run}/chat_train.jsonl.tmp", f"{run}/chat_train.jsonl")
PY
BASE=${BASE:-$RUN/chat_torch}
[ -d "$BASE" ] ||
    ./dev.sh python -m convert.torch_train --mode lossless --data "$RUN/chat_train.jsonl" \
        --out "$RUN/chat_torch" --gamma 4 --n-msa-layers "${MSA_LAYERS:-16}" --steps "${STEPS:-3000}" --batch-size 4 \
        --lr 3e-3 --segment 32 --warmup 20 --max-length 512 --checkpoint-every 25 --seed 0 \
        --device "${DEVICE:-cpu}"
RESULT=$BASE
if [ "${MIX_STEPS:-900}" != 0 ]; then
    read -r -a SEEDS <<< "${MIX_SEEDS:-0 0 0,1 0,1,2,3 0,1,2,3,4}"
    round=0
    for seeds in "${SEEDS[@]:0:${MIX_ROUNDS:-${#SEEDS[@]}}}"; do  # each round continues the last
        round=$((round + 1))
        rows=$RUN/chat_mix_rows_${seeds//,/_}.jsonl
        if [ ! -f "$rows" ]; then
            ./dev.sh python scripts/corpus.py unpack --split mix --chat-mix 2000 --seed "$seeds" \
                --rows "$RUN/mix_train_${seeds//,/_}.jsonl" --data-dir "$DATA_DIR"
            ./dev.sh python - "$RUN" "$RUN/mix_train_${seeds//,/_}.jsonl" "$rows" <<'PY'
import json, os, random, sys
run, mix_path, out = sys.argv[1:]
def usable(path):
    return [r for r in map(json.loads, open(path)) if not r.get("degenerate")]
mix, answers = usable(mix_path), usable(f"{run}/chat_train.jsonl")
rows = mix + random.Random(0).sample(answers, len(mix))
random.Random(0).shuffle(rows)
with open(f"{out}.tmp", "w") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
os.replace(f"{out}.tmp", out)
print(f"{len(mix)} mix answers + {len(mix)} instruction answers")
PY
        fi
        done_dir=$RUN/chat_mix_torch$([ "$round" = 1 ] || echo "_$round")
        if [ -f "$done_dir/adapter_config.json" ]; then
            echo "round $round: reusing $done_dir (trained before; delete it to train again)"
        else
            ./dev.sh python -m convert.torch_train --mode lossless --data "$rows" \
                --out "$done_dir" --gamma 4 --n-msa-layers "${MSA_LAYERS:-16}" \
                --steps "${MIX_STEPS:-900}" --batch-size 4 --lr 1e-3 --segment 32 --warmup 50 \
                --max-length 512 --checkpoint-every 25 --seed 0 --device "${DEVICE:-cpu}" \
                --init "$RESULT"
        fi
        RESULT=$done_dir
    done
fi
./dev.sh specstream convert --from "$RESULT" --to "$OUT.tmp" --overwrite
[ -f "$OUT/README.md" ] && cp "$OUT/README.md" "$OUT.tmp/README.md"
./dev.sh python - "$OUT.tmp" <<'PY'
import json, sys
p = f"{sys.argv[1]}/adapter_config.json"
c = json.load(open(p))
c["stream_config"].update(top_k=1, max_tree_nodes=2)
open(p, "w").write(json.dumps(c, indent=2) + "\n")
PY
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
if [ "${PARENT_RANK:-128}" != 0 ]; then
    head -n "${PARENT_ROWS:-400}" "$RUN/instructions_train.jsonl" > "$RUN/chat_parent_rows.jsonl"
    ./dev.sh specstream train --mode lossless --parent-rank "${PARENT_RANK:-128}" --from "$OUT" \
        --data "$RUN/chat_parent_rows.jsonl" --out "$RUN/chat_parent" --overwrite \
        --steps "${PARENT_STEPS:-300}" --batch-size 4 --segment 64 --lr 1e-3 --warmup 20 \
        --val-every 100 --checkpoint-every 25
    rm -rf "$OUT.tmp" && cp -r "$RUN/chat_parent" "$OUT.tmp"
    [ -f "$OUT/README.md" ] && cp "$OUT/README.md" "$OUT.tmp/README.md"
    # each head's PARENT_KEEP (112) hidden units with the largest |a column| x |b row| kept:
    # 4 heads of rank 128 (885k parameters) plus the streams' 159k exceed issue 20's 1e6 budget
    ./dev.sh python - "$OUT.tmp" "${PARENT_KEEP:-112}" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file, save_file
folder, keep = sys.argv[1], int(sys.argv[2])
w = load_file(f"{folder}/adapters.safetensors")
c = json.load(open(f"{folder}/adapter_config.json"))
for j in range(c["stream_config"]["gamma"]):
    a, b = w[f"parent_heads.{j}.a"], w[f"parent_heads.{j}.b"]
    units = np.sort(np.argsort(-np.linalg.norm(a, axis=0) * np.linalg.norm(b, axis=1))[:keep])
    w[f"parent_heads.{j}.a"] = np.ascontiguousarray(a[:, units])
    w[f"parent_heads.{j}.b"] = np.ascontiguousarray(b[units])
    for name in (f"parent_heads.{j}.a", f"parent_heads.{j}.b"):
        c.setdefault("shapes", {})[name] = list(w[name].shape)
save_file(w, f"{folder}/adapters.safetensors")
c["training"]["parent_heads_cut"] = {"from_rank": c["stream_config"]["parent_rank"], "kept": keep}
c["stream_config"]["parent_rank"] = keep
open(f"{folder}/adapter_config.json", "w").write(json.dumps(c, indent=2) + "\n")
PY
    # the heads stored as float16 (half their bytes; both runtimes widen them on loading)
    ./dev.sh specstream convert --from "$OUT.tmp" --to "$RUN/chat_parent_torch" --overwrite
    rm -rf "$OUT.tmp" && ./dev.sh specstream convert --from "$RUN/chat_parent_torch" \
        --to "$OUT.tmp" --heads-dtype float16
    [ -f "$OUT/README.md" ] && cp "$OUT/README.md" "$OUT.tmp/README.md"
    rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
./dev.sh specstream calibrate --adapter "$OUT" --measure-acceptance --overwrite --suite chat --data "$DATA_DIR" \
    --limit 48 --max-tokens 96
