#!/usr/bin/env bash
# Reruns every command of docs/BENCHMARKS.md, in the document's order, one step per command,
# grouped by the document's sections (each group's comment names its heading).
#
#   mkdir -p runs && scripts/regenerate_benchmarks.sh 2>&1 | tee runs/regenerate_benchmarks.log
#
# IT TAKES HOURS. On the 2-core dev machine ("dev-cpu") a full run takes about 6 hours (estimated)
# when the runs/ inputs below are already there, and about 4 more when they must be trained first.
# The per-step times in the comments are the ones docs/BENCHMARKS.md gives; "unknown" where it
# gives none. Time it with nothing else running on the machine: every figure is a timing.
#
# Options (environment variables):
#   DRY_RUN=1     print the numbered steps ([n/N] section: command) without running any
#   ONLY=TEXT     run only the steps whose section name contains TEXT (case-insensitive),
#                 e.g. ONLY="issue 8" or ONLY="Side by side"
#   FROM=N        start at step N (resume after an interruption; numbers as DRY_RUN=1 prints them)
#   SPECSTREAM_DATA  the data folder (default ../shared/data)
#   QWEN_CACHE    the private model cache of the Qwen load timings (default runs/regen_qwen_cache;
#                 emptied and refilled: 2.4 GB)
#
# What it writes: the JSON (and markdown) reports under docs/results/, the `specstream bench`
# tables of docs/BENCHMARKS.md (scripts/bench_tables.py, after the side-by-side benches), and
# the shipped adapters' acceptance.json (scripts/measure_acceptance.sh: greedy decoding, so the
# same statistics again unless the code changed). Every other table of docs/BENCHMARKS.md is
# typed from these reports and from what the steps print: keep the log (tee above) and update
# the prose by hand. Steps whose inputs live in runs/ (next-token LoRA baselines, the Medusa
# heads, the distilled chat rows) first train those inputs when they are missing ("only if ...
# is missing"). The figures that no command here can regenerate are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=${DRY_RUN:-0}
ONLY=${ONLY:-}
FROM=${FROM:-1}
D=${SPECSTREAM_DATA:-../shared/data}
R=docs/results
QC=${QWEN_CACHE:-runs/regen_qwen_cache}
QWEN=qwen2.5-coder-0.5b-instruct
EIFFEL="Summarize in two sentences: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed La dame de fer, it was constructed as the centrepiece of the 1889 World's Fair."
STORY="Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."

# ---- helpers ---------------------------------------------------------------------------------

show() {  # the command as one copy-pasteable line
    local a out=()
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./,:=+@%-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
    done
    echo "${out[*]}"
}

describe() {  # how step prints a command (the helpers below shown as what they do)
    case "$1" in
        into) echo "$(describe "${@:3}") > $2" ;;
        ensure) echo "$(describe "${@:3}")   (only if $2 is missing)" ;;
        qwen_load) echo "$([ "$2" = fresh ] && echo "rm -rf $QC; ")/usr/bin/time env SPECSTREAM_CACHE=$QC .venv/bin/python -c \"import specstream_mlx as ss; ss.load('$QWEN')\" (timed in-process too)" ;;
        qwen_calibrate) echo "SPECSTREAM_CACHE=$QC ./dev.sh specstream calibrate --model $QWEN --force --json, its curve_file copied to $R/calibration_qwen_curve.json" ;;
        *) show "$@" ;;
    esac
}

n=0
N=0
mode=count
step() {  # step "SECTION" COMMAND...: the n-th step
    local section=$1
    shift
    n=$((n + 1))
    [ "$mode" = count ] && return 0
    [ "$n" -lt "$FROM" ] && return 0
    if [ -n "$ONLY" ] && [[ ${section,,} != *"${ONLY,,}"* ]]; then return 0; fi
    printf '[%d/%d] %s: %s\n' "$n" "$N" "$section" "$(describe "$@")"
    [ "$DRY_RUN" = 1 ] && return 0
    "$@"
}

sql_alternated() {  # sql_alternated SECTION DIR:NAME DIR:NAME: both adapters benched on the sql
    local section=$1 t x  # dev set, alternated twice, into bench_sql_NAME_amd_1207_rT.json
    shift
    for t in 1 2; do
        for x in "$@"; do
            step "$section" ./dev.sh specstream bench --overwrite --suite sql \
                --data "$D/sql/dev.jsonl" --limit 10 --max-tokens 96 \
                --methods ar,ss,pld,ss+pld,mlx-lm --adapter "${x%%:*}" \
                --json $R/bench_sql_${x##*:}_amd_1207_r$t.json
        done
    done
}

same_lora() {  # same_lora SECTION A B: whether adapters A and B hold the same LoRA tensors
    step "$1" ./dev.sh python -c "import sys, mlx.core as mx
a, b = (mx.load(f'{x}/adapters.safetensors') for x in sys.argv[1:3])
lora = [k for k in b if 'lora' in k]
print(len(lora), 'LoRA tensors', 'identical' if all(mx.array_equal(a[k], b[k]).item()
      and a[k].dtype == b[k].dtype for k in lora) else 'DIFFERENT')" "$2" "$3"
}

into() {  # into FILE COMMAND...: COMMAND's stdout becomes FILE (replaced only if COMMAND succeeds)
    local file=$1
    shift
    "$@" > "$file.tmp"
    mv "$file.tmp" "$file"
}

ensure() {  # ensure PATH COMMAND...: run COMMAND (which makes PATH) only if PATH does not exist
    local path=$1
    shift
    if [ -e "$path" ]; then echo "    $path exists: not made again"; else "$@"; fi
}

qwen_load() {  # fresh|cached: one timed load of Qwen2.5-Coder-0.5B in $QC (fresh: empty it first)
    if [ "$1" = fresh ]; then rm -rf "$QC"; fi
    # GNU time prints the wall time and the peak RSS (maxresident); the script the in-process time
    /usr/bin/time env SPECSTREAM_CACHE="$QC" .venv/bin/python -c "import time; t = time.perf_counter(); import specstream_mlx as ss; ss.load('$QWEN'); print(f'in-process {time.perf_counter() - t:.1f} s')"
}

qwen_calibrate() {  # Qwen's latency curve measured again in $QC; its curve file kept in docs/results
    local out file
    out=$(SPECSTREAM_CACHE="$QC" ./dev.sh specstream calibrate --model "$QWEN" --force --json)
    file=$(printf '%s' "$out" | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["curve_file"])')
    cp "$file" "$R/calibration_qwen_curve.json"
    SPECSTREAM_CACHE="$QC" ./dev.sh specstream calibrate --model "$QWEN"  # the tables (cached curve)
}

side_by_side() {  # side_by_side SECTION NAME: the curve measured again, then every decoder and
    # mlx-lm on the chat suite and the sql dev set (10 prompts x 96 tokens), into
    # $R/calibration_NAME.json and $R/bench_NAME_{chat,sql}.{json,md}
    local section=$1 name=$2 b=(./dev.sh specstream bench --overwrite --limit 10 --max-tokens 96)
    local methods=ar,ss,pld,ss+pld,mlx-lm
    step "$section" into $R/calibration_$name.json ./dev.sh specstream calibrate --force --json
    step "$section" "${b[@]}" --suite chat --data "$D" --methods $methods \
        --json $R/bench_${name}_chat.json --markdown $R/bench_${name}_chat.md
    step "$section" "${b[@]}" --suite sql --data "$D/sql/dev.jsonl" --methods $methods \
        --json $R/bench_${name}_sql.json --markdown $R/bench_${name}_sql.md
}

writing_tools() {  # writing_tools SECTION TAG [SUMMARIZE]: the three writing tools on their dev
    # sets side by side with mlx-lm (10 prompts x 96 tokens), into
    # $R/bench_{sql,e2e,dialogsum}_TAG.*; SUMMARIZE: the summarize adapter (default: the shipped one)
    local section=$1 tag=$2 suite t p a
    for suite in "sql sql/dev.jsonl sql" "e2e e2e/dev.csv data2text" \
        "dialogsum dialogsum/dev.jsonl ${3:-summarize}"; do
        read -r t p a <<< "$suite"
        step "$section" ./dev.sh specstream bench --overwrite --suite "$t" --data "$D/$p" --limit 10 \
            --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --adapter "$a" \
            --json $R/bench_${t}_$tag.json --markdown $R/bench_${t}_$tag.md
    done
}

qwen_sql() {  # qwen_sql SECTION DAY: Qwen's curve measured afresh (about 9 min), then the
    # sql dev set side by side (16 prompts x 64 tokens, 12-15 min), into
    # $R/calibration_qwen_sql_intel_DAY.json and $R/bench_qwen_sql_intel_DAY.{json,md}
    local section=$1 day=$2
    step "$section" into $R/calibration_qwen_sql_intel_$day.json env SPECSTREAM_CACHE="$QC" \
        ./dev.sh specstream calibrate --model "$QWEN" --adapter sql --force --json
    step "$section" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" \
        --suite sql --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter sql \
        --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_sql_intel_$day.json \
        --markdown $R/bench_qwen_sql_intel_$day.md
}

# ---- the steps, in the order of docs/BENCHMARKS.md --------------------------------------------

steps() {
    local S B MEM AB t p a rows suite methods x

    # == Lookup remembers earlier answers (issues 18 and 19) ==
    # the lookup with and without the memory, paired (Qwen about 13 min, SmolLM2 about 7), the
    # two sql tables with every decoder (Qwen about 12 min, SmolLM2 about 4), and the tokens a
    # pass the lookup decides with each memory (counted, Qwen about 6 min; printed: read off the log)
    S="Lookup remembers earlier answers"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/lookup_memory.py --model "$QWEN" \
        --adapter sql --suite sql --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 \
        --json $R/lookup_memory_qwen_sql_amd_1207.json
    step "$S" ./dev.sh python benchmarks/lookup_memory.py --adapter sql --suite sql \
        --data "$D/sql/dev.jsonl" --limit 20 --max-tokens 96 --json $R/lookup_memory_sql_amd_1207.json
    # the same on the chat suite (SmolLM2 about 4 min, Qwen about 7)
    step "$S" ./dev.sh python benchmarks/lookup_memory.py --adapter chat --suite chat --data "$D" \
        --limit 10 --max-tokens 96 --json $R/lookup_memory_chat_amd_1207.json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/lookup_memory.py --model "$QWEN" \
        --adapter chat --suite chat --data "$D" --limit 10 --max-tokens 64 \
        --json $R/lookup_memory_qwen_chat_amd_1207.json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" \
        --suite sql --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter sql \
        --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_sql_memory_amd_1207.json \
        --markdown $R/bench_qwen_sql_memory_amd_1207.md
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
        --limit 10 --max-tokens 96 --adapter sql --methods ar,ss,pld,ss+pld,mlx-lm \
        --json $R/bench_sql_memory_amd_1207.json --markdown $R/bench_sql_memory_amd_1207.md
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/recall_reach.py --model "$QWEN" \
        --adapter sql --suite sql --data "$D/sql/dev.jsonl" --limit 48 --max-tokens 96 \
        --json $R/recall_reach_qwen_sql_1207.json

    # == Qwen's sql and chat under the current planner (issue 19) ==
    # the shipped Qwen `sql` and `chat` with every decoder (about 30 min), on the curve cached
    # in $QC (measured on first use where there is none, about 5 min more)
    S="Qwen's sql and chat under the current planner"
    for x in "sql:sql:$D/sql/dev.jsonl" "chat:chat:$D"; do
        IFS=: read -r a suite p <<< "$x"
        step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" \
            --suite "$suite" --data "$p" --limit 16 --max-tokens 64 --adapter "$a" \
            --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_${a}_v8_amd_1207.json \
            --markdown $R/bench_qwen_${a}_v8_amd_1207.md
    done
    # how ss+pld's lookup gate decided on the sql prompts (counts, 2 min; printed: read off the log)
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/graft_count.py --model "$QWEN" \
        --adapter sql --suite sql --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64

    # == Issue 20's stream targets against the shipped adapters (issue 20) ==
    # read from the shipped adapters' acceptance.json (seconds; nothing decoded)
    S="Issue 20's stream targets against the shipped adapters"
    step "$S" ./dev.sh python benchmarks/shipped_targets.py --json $R/shipped_targets_1207.json

    # == The planner charges a tree per confidence bin its un-pipelined pass (issue 18) ==
    # an idle curve (about 2 min), then the new side of the section's table: chat with every
    # decoder, sql twice, data2text and summarize (about 15 min; the old side needs the code
    # of a6cfa51: listed at the end)
    S="The planner charges a tree per confidence bin"
    step "$S" ./dev.sh specstream calibrate --force
    step "$S" ./dev.sh specstream bench --overwrite --suite chat --data "$D" --limit 10 \
        --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --json $R/gated_price_chat_new.json
    for x in "sql:sql:sql/dev.jsonl:new_r1" "sql:sql:sql/dev.jsonl:new_r2" \
        "data2text:e2e:e2e/dev.csv:new" "summarize:dialogsum:dialogsum/dev.jsonl:new"; do
        IFS=: read -r a suite p B <<< "$x"
        methods=ar,ss
        [ "$a" = sql ] && methods=ar,ss,ss+pld,mlx-lm
        step "$S" ./dev.sh specstream bench --overwrite --suite "$suite" --data "$D/$p" \
            --limit 10 --max-tokens 96 --methods "$methods" --adapter "$a" \
            --json $R/gated_price_${a}_${B}.json
    done
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
        --limit 10 --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm \
        --json $R/bench_sql_readme_amd_1207.json  # the README's sql column
    # Qwen's plans under version 8 (docs/models.md): its curve measured afresh (about 5 min)
    step "$S" into $R/calibration_qwen_sql_v8_amd_1207.json env SPECSTREAM_CACHE="$QC" \
        ./dev.sh specstream calibrate --model "$QWEN" --adapter sql --force --json
    step "$S" into $R/calibration_qwen_chat_v8_amd_1207.json env SPECSTREAM_CACHE="$QC" \
        ./dev.sh specstream calibrate --model "$QWEN" --adapter chat --json

    # == sql ships with its streams in 12 MSA layers (issues 20 and 18) ==
    # the next section's 12-layer chain with parent heads of rank 120 (about 20 min once the
    # next section's streams exist; they are reused, their heads kept apart), the 8-layer one
    # (its training skipped where done; repacked and its acceptance measured again, about 10
    # min), the LoRA tensors compared, an idle curve, then the two alternated
    S="sql ships with its streams in 12 MSA layers"
    step "$S" env RUN_DIR=runs/sql12 BASELINE=runs/baselines/sql_next_token_all MSA_LAYERS=12 \
        PARENT_RANK=120 OUT=runs/sql12/packed_out120 scripts/make_packed_adapter.sh sql
    step "$S" env RUN_DIR=runs MSA_LAYERS=8 PARENT_RANK=128 OUT=runs/sql_packed_out \
        scripts/make_packed_adapter.sh sql
    same_lora "$S" runs/sql12/packed_out120 runs/sql_packed_out
    step "$S" ./dev.sh specstream calibrate --force
    sql_alternated "$S" runs/sql12/packed_out120:msa12r120 runs/sql_packed_out:msa8_with_r120
    # == sql's streams in 12 MSA layers (issues 20 and 18) ==
    # the 12-layer packed chain on the every-block baseline (about 8 hours when the baseline must
    # be trained first, else about 1.7; it resumes), the 8-layer one of the next section (the
    # same script, skipped where built), the LoRA tensors compared, an idle curve (about 2 min),
    # then the two alternated, 12 / 8 / 12 / 8 (about 10 min)
    S="sql's streams in 12 MSA layers"
    step "$S" env RUN_DIR=runs/sql12 BASELINE=runs/baselines/sql_next_token_all MSA_LAYERS=12 \
        PARENT_RANK=128 OUT=runs/sql12/packed_out scripts/make_packed_adapter.sh sql
    step "$S" env RUN_DIR=runs MSA_LAYERS=8 PARENT_RANK=128 OUT=runs/sql_packed_out \
        scripts/make_packed_adapter.sh sql
    same_lora "$S" runs/sql12/packed_out runs/sql_packed_out
    step "$S" ./dev.sh specstream calibrate --force
    sql_alternated "$S" runs/sql12/packed_out:msa12 runs/sql_packed_out:msa8

    # == sql ships as a packed adapter (issues 20 and 18) ==
    # the packed chain (about 8 hours: the every-block baseline about 6.5 of them; it resumes),
    # its answers against the baseline's on all 200 dev rows (about 16 min), the baseline
    # alone on each half (about 8 min each), then the packed adapter and the sql shipped before
    # it (main stream ignoring its streams, commit 3ebd52d) alternated (about 10 min)
    S="sql ships as a packed adapter"
    step "$S" env RUN_DIR=runs MSA_LAYERS=8 PARENT_RANK=128 OUT=runs/sql_packed_out \
        scripts/make_packed_adapter.sh sql
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
        --adapter runs/sql_packed_out --methods ar,lora --lora runs/baselines/sql_next_token_all \
        --limit 200 --max-tokens 64 --json $R/quality_sql_packed_200.json
    step "$S" sh -c "sed -n 101,200p $D/sql/dev.jsonl > runs/sql_dev_100_199.jsonl"
    for x in "$D/sql/dev.jsonl:0_99" "runs/sql_dev_100_199.jsonl:100_199"; do
        step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "${x%%:*}" \
            --methods ar,lora --lora runs/baselines/sql_next_token_all --limit 100 \
            --max-tokens 64 --json $R/quality_sql_mlx_baseline_${x##*:}.json
    done
    step "$S" ensure runs/ignores_3ebd52d/sql sh -c "mkdir -p runs/ignores_3ebd52d && git archive \
        3ebd52d specstream_mlx/adapters/sql | tar -x -C runs/ignores_3ebd52d --strip-components=2"
    sql_alternated "$S" runs/sql_packed_out:packed runs/ignores_3ebd52d/sql:shipped

    # == sql's and data2text's main streams stop reading their streams (issue 18) ==
    # the two tools as shipped until then (from git, commit e95a6ed) made into copies whose main
    # stream ignores its streams, scored (data2text on 40 e2e dev rows, sql on all 200: about 25
    # min), their acceptance measured again (about 10 min), then an idle curve (about 2 min;
    # the section's runs used the one cached the night before) and each shipped one alternated
    # with the one before, reads / ignores / ignores / reads (about 15 min)
    S="sql's and data2text's main streams stop reading their streams"
    for a in sql data2text; do
        step "$S" ensure runs/reads_e95a6ed/$a sh -c "mkdir -p runs/reads_e95a6ed && git archive \
            e95a6ed specstream_mlx/adapters/$a | tar -x -C runs/reads_e95a6ed --strip-components=2"
        step "$S" ./dev.sh python scripts/main_ignores_streams.py runs/reads_e95a6ed/$a \
            runs/ignores/$a --overwrite
    done
    for x in "data2text e2e e2e/dev.csv 40" "sql sql sql/dev.jsonl 200"; do
        read -r a t p rows <<< "$x"
        step "$S" ./dev.sh specstream bench --overwrite --suite $t --data "$D/$p" \
            --adapter runs/ignores/$a --methods ar --limit $rows --max-tokens 64 \
            --json $R/quality_${a}_ignores_$rows.json
        step "$S" into $R/calibration_${a}_ignores_amd_1207.json ./dev.sh specstream calibrate \
            --adapter runs/ignores/$a --measure-acceptance --overwrite --suite $t --data "$D/$p" \
            --limit 48 --max-tokens 96 --json
    done
    step "$S" ./dev.sh specstream calibrate --force
    for t in 1 2; do
        for a in "d2t data2text e2e e2e/dev.csv ar,ss,mlx-lm" \
            "sql sql sql sql/dev.jsonl ar,ss,ss+pld,mlx-lm"; do
            read -r B a suite p methods <<< "$a"
            AB="runs/reads_e95a6ed/$a:reads runs/ignores/$a:ignores"  # sql's shipped: packed
            [ $t = 2 ] && AB="runs/ignores/$a:ignores runs/reads_e95a6ed/$a:reads"
            for x in $AB; do
                step "$S" ./dev.sh specstream bench --overwrite --suite $suite --data "$D/$p" \
                    --limit 10 --max-tokens 96 --adapter "${x%%:*}" --methods $methods \
                    --json $R/paired_${B}_${x##*:}_${t}_amd_1207.json
            done
        done
    done
    # issue 18's writing-tool table with the tools as shipped since (about 12 min)
    step "$S" into $R/calibration_amd_1207.json ./dev.sh specstream calibrate --force --json
    writing_tools "$S" amd_1207
    for t in 1 2 3; do  # issue 18's adapter target, the shipped sql (about 1 min each)
        step "$S" ./dev.sh python benchmarks/fused_lora.py --cycles 5 --prompts 4 --max-tokens 64 \
            --json $R/fused_lora_amd_1207_$t.json
    done

    # == A latency curve in three quarters of the time (issue 18) ==
    # the curve measured by the code before (commit e95a6ed, a worktree on PYTHONPATH: its
    # specstream_mlx; the CLI, unchanged, is the checkout's) and since, alternated twice (about
    # 10 min), then fresh and rewound starts paired (about 2 min)
    S="A latency curve in three quarters of the time"
    step "$S" ensure runs/old_e95a6ed git worktree add --detach runs/old_e95a6ed e95a6ed
    for t in 1 2; do
        step "$S" into $R/calibration_old_loops_${t}_amd_1207.json env \
            PYTHONPATH="$PWD/runs/old_e95a6ed" .venv/bin/specstream calibrate --force --json
        step "$S" into $R/calibration_rewound_${t}_amd_1207.json ./dev.sh specstream calibrate \
            --force --json
    done
    step "$S" ./dev.sh python benchmarks/rewound_loops.py --rounds 9 \
        --json $R/rewound_loops_amd_1207.json

    # == summarize's main stream stops reading its streams (issues 18 and 20) ==
    # an idle latency curve (about 3 min), issue 18's writing-tool table with summarize as it
    # was shipped until then (from git, commit 5523dee; about 9 min), that adapter made into one
    # whose main stream ignores its streams with its old acceptance.json (the "flipped" probe)
    # and as shipped since (acceptance measured again), both scored on 100 dev rows (about 10
    # min), the shipped one's table row, then the two alternated twice (about 10 min)
    S="summarize's main stream stops reading its streams"
    step "$S" into $R/calibration_amd_1206.json ./dev.sh specstream calibrate --force --json
    step "$S" ensure runs/summarize_reads/summarize sh -c "mkdir -p runs/summarize_reads && git \
        archive 5523dee specstream_mlx/adapters/summarize | tar -x -C runs/summarize_reads \
        --strip-components=2"
    writing_tools "$S" amd_1206 runs/summarize_reads/summarize
    step "$S" ./dev.sh python scripts/main_ignores_streams.py runs/summarize_reads/summarize \
        runs/summarize_flipped --overwrite
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --limit 10 --max-tokens 96 --methods ar,ss,ss+pld,mlx-lm --adapter runs/summarize_flipped \
        --json $R/bench_dialogsum_flipped_amd_1206.json \
        --markdown $R/bench_dialogsum_flipped_amd_1206.md
    for a in "summarize ignores_100" "runs/summarize_reads/summarize shipped_amd_100"; do
        read -r p t <<< "$a"
        step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum \
            --data "$D/dialogsum/dev.jsonl" --adapter "$p" --methods ar --limit 100 \
            --max-tokens 64 --json $R/quality_summarize_$t.json
    done
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --limit 10 --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --adapter summarize \
        --json $R/bench_dialogsum_ignores_amd_1206.json \
        --markdown $R/bench_dialogsum_ignores_amd_1206.md
    for t in 1 2; do
        for a in "runs/summarize_reads/summarize reads" "summarize ignores"; do
            read -r p B <<< "$a"
            step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum \
                --data "$D/dialogsum/dev.jsonl" --limit 10 --max-tokens 96 --adapter "$p" \
                --methods ar,ss,mlx-lm --json $R/paired_summarize_${B}_${t}_amd_1206.json
        done
    done

    # == An adapter kind that keeps a LoRA's answers (issues 20 and 18) ==
    # the packed recipe's smoke run (2-step baseline and streams, about 10 min), then plain
    # decoding of it and of the shipped sql beside mlx-lm on 10 dev rows (about 5 min)
    S="An adapter kind that keeps a LoRA's answers"
    step "$S" ensure runs/packed_smoke/sql env STEPS=2 PARENT_STEPS=2 RUN_DIR=runs/packed_smoke \
        MSA_LAYERS=8 PARENT_RANK=128 OUT=runs/packed_smoke/sql scripts/make_packed_adapter.sh sql
    for a in runs/packed_smoke/sql sql; do
        step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
            --adapter $a --methods ar,mlx-lm --limit 10 --max-tokens 64 \
            --json $R/bench_plain_$( [ $a = sql ] && echo sql_shipped_10_s65 || echo packed_smoke_10).json
    done

    # == summarize holds its quality against a full-budget baseline (issue 20) ==
    # summarize's torch baseline (about 95 min alone, if missing) scored beside the shipped
    # tool on 100 dev rows (about 18 min), sql against its baseline on all 200 dev rows (about
    # 30 min); the two-stage sql's acceptance (about 4 min; the
    # next section's step makes it if missing: run that section first)
    S="summarize holds its quality against a full-budget baseline"
    step "$S" ensure runs/baselines/summarize_next_token_all_torch env ENGINE=torch LORA_LAYERS=0 \
        BASELINE_OUT=runs/baselines/summarize_next_token_all_torch \
        scripts/make_task_adapter.sh summarize --baseline-only
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum \
        --data "$D/dialogsum/dev.jsonl" --adapter summarize --methods ar,lora \
        --lora runs/baselines/summarize_next_token_all_torch --limit 100 --max-tokens 64 \
        --json $R/quality_summarize_next_token_torch_100.json \
        --markdown $R/quality_summarize_next_token_torch_100.md
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
        --adapter sql --methods ar,lora --lora runs/baselines/sql_next_token_all_torch \
        --limit 200 --max-tokens 64 --json $R/quality_sql_next_token_torch_200.json \
        --markdown $R/quality_sql_next_token_torch_200.md
    step "$S" rm -rf runs/sql_two_stage/copy
    step "$S" cp -r runs/sql_two_stage/sql runs/sql_two_stage/copy
    step "$S" into $R/calibration_sql_two_stage.json ./dev.sh specstream calibrate \
        --adapter runs/sql_two_stage/copy --measure-acceptance --overwrite --suite sql \
        --data "$D/sql/dev.jsonl" --limit 48 --max-tokens 96 --json
    # lossless streams over sql's torch baseline merged into the model (about 30 min alone)
    step "$S" ensure runs/probe/sql_fused ./dev.sh python scripts/fuse_next_token.py \
        runs/baselines/sql_next_token_all_torch runs/probe/sql_fused
    step "$S" ensure runs/probe/sql_lossless750_torch ./dev.sh python -m convert.torch_train \
        --mode lossless --model runs/probe/sql_fused --task sql --data "$D/sql/train.jsonl" \
        --targets self --n-msa-layers 8 --gamma 4 --lr 3e-3 --segment 64 --warmup 20 \
        --steps 750 --batch-size 4 --max-length 320 --checkpoint-every 25 --device cpu \
        --out runs/probe/sql_lossless750_torch
    step "$S" ./dev.sh specstream convert --from runs/probe/sql_lossless750_torch \
        --to runs/probe/sql_lossless750 --model runs/probe/sql_fused --overwrite
    step "$S" into $R/calibration_sql_lossless_fused_750.json ./dev.sh specstream calibrate \
        --model runs/probe/sql_fused --adapter runs/probe/sql_lossless750 --measure-acceptance \
        --overwrite --suite sql --data "$D/sql/dev.jsonl" --limit 48 --max-tokens 96 --json
    # its parent heads (about 33 min beside a bench here) and a draft vocabulary, each measured
    step "$S" bash -c "head -n 800 $D/sql/train.jsonl > runs/probe/sql_parent_rows.jsonl"
    step "$S" ensure runs/probe/sql_lossless750_parent ./dev.sh specstream train \
        --model runs/probe/sql_fused --mode lossless --targets self --parent-rank 128 \
        --from runs/probe/sql_lossless750 --task sql --data runs/probe/sql_parent_rows.jsonl \
        --out runs/probe/sql_lossless750_parent --steps 200 --batch-size 4 --segment 64 \
        --lr 1e-3 --warmup 20 --val-every 100 --checkpoint-every 25
    step "$S" ./dev.sh python scripts/draft_vocab.py --model runs/probe/sql_fused \
        --adapter runs/probe/sql_lossless750_parent --task sql --data "$D/sql/train.jsonl" \
        --size 8192 --out runs/probe/sql_lossless750_vocab --overwrite
    for t in parent vocab; do
        step "$S" into $R/calibration_sql_lossless_fused_750_$t.json ./dev.sh specstream \
            calibrate --model runs/probe/sql_fused --adapter runs/probe/sql_lossless750_$t \
            --measure-acceptance --overwrite --suite sql --data "$D/sql/dev.jsonl" --limit 48 \
            --max-tokens 96 --json
    done
    step "$S" ./dev.sh specstream bench --overwrite --model runs/probe/sql_fused --suite sql \
        --data "$D/sql/dev.jsonl" --adapter runs/probe/sql_lossless750_vocab --methods ar,ss \
        --limit 10 --max-tokens 96 --json $R/bench_sql_lossless_fused_vocab_10.json \
        --markdown $R/bench_sql_lossless_fused_vocab_10.md
    step "$S" ./dev.sh specstream bench --overwrite --model runs/probe/sql_fused --suite sql \
        --data "$D/sql/dev.jsonl" --adapter runs/probe/sql_lossless750_vocab \
        --methods ar,ss+pld,mlx-lm --limit 10 --max-tokens 96 \
        --json $R/bench_sql_lossless_fused_vocab_pld_10.json \
        --markdown $R/bench_sql_lossless_fused_vocab_pld_10.md

    # == sql's two-stage recipe (issue 20) ==
    # streams trained on the torch baseline's frozen LoRA (about 45 min; the baseline is made
    # first, by the next section's step, if missing), its answers on 100 dev rows (about 9 min)
    S="sql's two-stage recipe"
    step "$S" ensure runs/baselines/sql_next_token_all_torch env ENGINE=torch LORA_LAYERS=0 \
        BASELINE_OUT=runs/baselines/sql_next_token_all_torch \
        scripts/make_task_adapter.sh sql --baseline-only
    step "$S" ensure runs/sql_two_stage/sql env ENGINE=torch \
        INIT=runs/baselines/sql_next_token_all_torch LORA_LR=0 PARENT_RANK=0 \
        OUT=runs/sql_two_stage/sql scripts/make_task_adapter.sh sql
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
        --adapter runs/sql_two_stage/sql --methods ar --limit 100 --max-tokens 64 \
        --json $R/quality_sql_two_stage_100.json --markdown $R/quality_sql_two_stage_100.md

    # == The next-token baseline in PyTorch (issue 20) ==
    # 12 steps of each next-token trainer on sql's recipe (about 1 and 4 min); the table is read
    # off the torch log's last `seconds` and the MLX folder's training.seconds
    S="The next-token baseline in PyTorch"
    step "$S" ./dev.sh python -m convert.torch_train --mode next-token --task sql \
        --data "$D/sql/train.jsonl" --steps 12 --batch-size 4 --max-length 320 --lora-lr 5e-5 \
        --warmup 10 --seed 0 --device cpu --out runs/speed/torch_sql --overwrite
    step "$S" ./dev.sh specstream train --mode next-token --task sql \
        --data "$D/sql/train.jsonl" --steps 12 --batch-size 4 --max-length 320 --lora-rank 8 \
        --lora-lr 5e-5 --lora-layers 0 --warmup 10 --seed 0 --out runs/speed/mlx_sql --overwrite
    # sql's baseline from the torch trainer (about 33 min) scored on 100 dev rows (about 11 min)
    step "$S" ensure runs/baselines/sql_next_token_all_torch env ENGINE=torch LORA_LAYERS=0 \
        BASELINE_OUT=runs/baselines/sql_next_token_all_torch \
        scripts/make_task_adapter.sh sql --baseline-only
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" \
        --adapter sql --methods ar,lora --lora runs/baselines/sql_next_token_all_torch \
        --limit 100 --max-tokens 64 --json $R/quality_sql_next_token_torch_100.json \
        --markdown $R/quality_sql_next_token_torch_100.md

    # == data2text's next-token baseline with LoRA in every block (issue 20) ==
    # the baseline trained if missing (about 70 min alone at the 5.6 s a step seen on the Intel
    # instance), then scored beside the shipped `data2text` on e2e dev items 0-39 (about 6 min)
    S="data2text's next-token baseline with LoRA in every block"
    step "$S" ensure runs/baselines/data2text_next_token_all env LORA_LAYERS=0 \
        BASELINE_OUT=runs/baselines/data2text_next_token_all \
        scripts/make_task_adapter.sh data2text --baseline-only
    step "$S" ./dev.sh specstream bench --overwrite --suite e2e --data "$D/e2e/dev.csv" \
        --adapter data2text --methods ar,lora --lora runs/baselines/data2text_next_token_all \
        --limit 40 --max-tokens 64 --json $R/quality_e2e_next_token_every_block.json \
        --markdown $R/quality_e2e_next_token_every_block.md

    # == A generation drafts from its prompt's tokens (issue 19) ==
    # the streams over their adapter's vocabulary and the prompt's tokens, paired with the
    # adapter's vocabulary alone, `ss` and `ss+pld`: Qwen's sql and chat (about 12 min each),
    # SmolLM2's sql (about 6 min); then the first generation after an adapter is made active
    # (about 1 min)
    S="A generation drafts from its prompt's tokens"
    step "$S" env SPECSTREAM_CACHE="$QC" PYTHONPATH=benchmarks ./dev.sh python \
        benchmarks/prompt_vocab.py --model "$QWEN" --adapter sql --suite sql \
        --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 \
        --json $R/prompt_vocab_qwen_sql_1206.json
    step "$S" env SPECSTREAM_CACHE="$QC" PYTHONPATH=benchmarks ./dev.sh python \
        benchmarks/prompt_vocab.py --model "$QWEN" --adapter chat --suite chat --data "$D" \
        --limit 16 --max-tokens 64 --json $R/prompt_vocab_qwen_chat_1206.json
    step "$S" env PYTHONPATH=benchmarks ./dev.sh python benchmarks/prompt_vocab.py \
        --adapter sql --suite sql --data "$D/sql/dev.jsonl" --limit 10 --max-tokens 96 \
        --json $R/prompt_vocab_sql_1206.json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/first_generation.py
    # Qwen sql's acceptance statistics with the prompt's tokens, on a copy of the shipped folder
    # (about 12 min), then paired with the shipped statistics (about 12 min)
    step "$S" rm -rf runs/qsql_prompt
    step "$S" cp -r specstream_mlx/adapters/$QWEN/sql runs/qsql_prompt
    step "$S" into $R/acceptance_qwen_sql_prompt_tokens_1206.json env SPECSTREAM_CACHE="$QC" \
        ./dev.sh specstream calibrate --model "$QWEN" --adapter runs/qsql_prompt \
        --measure-acceptance --overwrite --suite sql --data "$D/sql/dev.jsonl" --skip 40 --limit 48 \
        --max-tokens 96 --json
    step "$S" env SPECSTREAM_CACHE="$QC" PYTHONPATH=benchmarks ./dev.sh python \
        benchmarks/acceptance_pair.py --other runs/qsql_prompt --model "$QWEN" --adapter sql \
        --suite sql --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 \
        --json $R/acceptance_pair_qwen_sql_1206.json
    # == What Qwen's sql draft vocabulary leaves out (issue 19) ==
    # the probe (plain decoding and three vocabularies, about 15 min), then the shipped adapter
    # and the probe's rows vocabulary benchmarked (about 12 min each)
    S="What Qwen's sql draft vocabulary leaves out"
    step "$S" env SPECSTREAM_CACHE="$QC" PYTHONPATH=benchmarks ./dev.sh python \
        benchmarks/draft_vocab_probe.py --model "$QWEN" --adapter sql --suite sql \
        --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --rows "$D/sql/train.jsonl" \
        --out runs/vocab --json $R/draft_vocab_qwen_sql_1206.json
    for vocab in shipped rows; do
        adapter=sql
        [ $vocab = rows ] && adapter=runs/vocab/rows
        step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" \
            --suite sql --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter $adapter \
            --methods ar,ss,ss+pld --json $R/bench_qwen_sql_vocab_${vocab}_1206.json \
            --markdown $R/bench_qwen_sql_vocab_${vocab}_1206.md
    done

    # == Issue 18's and 19's tables on an Intel instance (issues 18 and 19) ==
    # Qwen's curve and sql table (qwen_sql), its chat table (about 20 min), SmolLM2's curve
    # measured afresh and the three writing tools (writing_tools): about 55 min
    S="Issue 18's and 19's tables on an Intel instance"
    qwen_sql "$S" 1205
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite chat \
        --data "$D" --limit 16 --max-tokens 64 --adapter chat --methods ar,ss,pld,ss+pld,mlx-lm \
        --json $R/bench_qwen_chat_intel_1205.json --markdown $R/bench_qwen_chat_intel_1205.md
    step "$S" into $R/calibration_sql_intel_1205.json ./dev.sh specstream calibrate --adapter sql --force --json
    writing_tools "$S" intel_1205

    # == `ss+pld` verifies the lookup's chain alone where that pays (issues 18 and 19) ==
    # ss+pld choosing against ss+pld always keeping the streams' tree, paired with pld, ss and
    # ar: Qwen's sql (about 10 min), SmolLM2's sql (once, then two rounds), data2text and
    # summarize (8-10 min each; since 5127c0b shared streams are not offered the chain alone, so
    # their "choosing" equals always-grafted); the split chain rate (fc59f96, reverted) is not
    # rerun
    S="ss+pld verifies the lookup's chain alone"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/chain_alone.py \
        --model "$QWEN" --adapter sql --suite sql --data "$D/sql/dev.jsonl" --limit 16 \
        --max-tokens 64 --json $R/chain_alone_qwen_sql_amd_1205.json
    step "$S" ./dev.sh python benchmarks/chain_alone.py --adapter sql --suite sql \
        --data "$D/sql/dev.jsonl" --limit 10 --max-tokens 96 --json $R/chain_alone_sql_amd_1205.json
    step "$S" ./dev.sh python benchmarks/chain_alone.py --adapter sql --suite sql \
        --data "$D/sql/dev.jsonl" --limit 10 --max-tokens 96 --rounds 2 \
        --json $R/chain_alone_sql_rounds2_amd_1205.json
    step "$S" ./dev.sh python benchmarks/chain_alone.py --adapter data2text --suite e2e \
        --data "$D/e2e/dev.csv" --limit 10 --max-tokens 96 --json $R/chain_alone_e2e_amd_1205.json
    step "$S" ./dev.sh python benchmarks/chain_alone.py --adapter summarize --suite dialogsum \
        --data "$D/dialogsum/dev.jsonl" --limit 10 --max-tokens 96 \
        --json $R/chain_alone_dialogsum_amd_1205.json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite sql \
        --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter sql \
        --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_sql_chain_alone_amd_1205.json \
        --markdown $R/bench_qwen_sql_chain_alone_amd_1205.md

    # == Qwen's chat with every decoder (issue 19) ==
    # the shipped Qwen `chat` with every decoder on 16 chat prompts (about 20 min)
    S="Qwen's chat with every decoder"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite chat \
        --data "$D" --limit 16 --max-tokens 64 --adapter chat --methods ar,ss,pld,ss+pld,mlx-lm \
        --json $R/bench_qwen_chat_all_amd_1205.json --markdown $R/bench_qwen_chat_all_amd_1205.md

    # == sql's next-token baseline with LoRA in every block (issue 20) ==
    # the baseline trained if missing (about 2 hours alone here), then scored beside the
    # shipped `sql` on dev items 0-39 (about 10 min)
    S="sql's next-token baseline with LoRA in every block"
    step "$S" ensure runs/baselines/sql_next_token_all env LORA_LAYERS=0 \
        BASELINE_OUT=runs/baselines/sql_next_token_all scripts/make_task_adapter.sh sql --baseline-only
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --adapter sql \
        --methods ar,lora --lora runs/baselines/sql_next_token_all --limit 40 --max-tokens 64 \
        --json $R/quality_sql_next_token_every_block.json \
        --markdown $R/quality_sql_next_token_every_block.md

    # == Qwen's sql streams read their parent's token (issue 19) ==
    # Qwen's curve measured afresh (about 9 min; measured with round 2's streams shipped, whose
    # plan it printed: the plan now printed is round 3's), the shipped `sql`'s acceptance on sql
    # dev items 40-87 on a copy (about 8 min), then the bench (about 12 min). Its training is
    # scripts/make_qwen_sql_adapter.sh's round 3 (about 45 min after a 20-min distillation), not redone.
    S="Qwen's sql streams read their parent's token"
    step "$S" into $R/calibration_qwen_sql_amd_1205.json env SPECSTREAM_CACHE="$QC" \
        ./dev.sh specstream calibrate --model "$QWEN" --adapter sql --force --json
    step "$S" bash -c "rm -rf runs/acc_qwen_sql && mkdir -p runs && cp -r specstream_mlx/adapters/$QWEN/sql runs/acc_qwen_sql"
    step "$S" into $R/acceptance_qwen_sql_parent_items40_87.json env SPECSTREAM_CACHE="$QC" \
        ./dev.sh specstream calibrate --model "$QWEN" --adapter runs/acc_qwen_sql \
        --measure-acceptance --overwrite --suite sql --data "$D/sql/dev.jsonl" --limit 48 --max-tokens 96 --json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite sql \
        --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter sql \
        --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_sql_parent_amd_1205.json \
        --markdown $R/bench_qwen_sql_parent_amd_1205.md

    # == summarize's parent heads learn its own summaries (issues 18 and 20) ==
    # the shipped `summarize` (parent heads on its own summaries since 2026-12-05): its
    # acceptance on dialogsum dev items 40-75 on a copy (about 3 min), the writing tool side by
    # side with mlx-lm (about 5 min), then both trainers' throughput (about 12 min). Its training
    # is scripts/make_task_adapter.sh summarize's last step (about an hour), not redone.
    S="summarize's parent heads learn its own summaries"
    step "$S" bash -c "rm -rf runs/acc_summarize && mkdir -p runs && cp -r specstream_mlx/adapters/summarize runs/acc_summarize"
    step "$S" into $R/acceptance_summarize_own_parent_items40_75.json ./dev.sh specstream \
        calibrate --adapter runs/acc_summarize --measure-acceptance --overwrite --suite dialogsum \
        --data "$D/dialogsum/dev.jsonl" --limit 36 --max-tokens 96 --json
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --limit 10 --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --adapter summarize \
        --json $R/bench_dialogsum_own_parent_amd_1205.json \
        --markdown $R/bench_dialogsum_own_parent_amd_1205.md
    step "$S" env PYTHONPATH=. ./dev.sh python benchmarks/train_throughput.py --engine torch \
        --examples 8 --epochs 2 --lora-layers 0 8 --json $R/train_throughput_torch_amd_1205.json
    step "$S" ./dev.sh python benchmarks/train_throughput.py --examples 8 --epochs 2 \
        --lora-layers 0 8 --json $R/train_throughput_mlx_amd_1205.json

    # == Parent heads for the writing tools, and a draft vocabulary (issues 18 and 20) ==
    # a head over K columns timed (about 2 min), then the shipped `data2text` and `sql` (parent
    # heads and a vocabulary since 2026-12-05): their acceptance on copies (about 4 min each)
    # and the bench (about 5 min each; sql's shipped row was run with --methods ar,ss,ss+pld).
    # The rows of the adapters before, and their training, are not redone.
    S="Parent heads for the writing tools, and a draft vocabulary"
    step "$S" ./dev.sh python benchmarks/draft_head.py --rounds 9 \
        --json $R/draft_head_amd_1205.json
    for t in "e2e e2e/dev.csv data2text" "sql sql/dev.jsonl sql"; do
        read -r t p a <<< "$t"
        step "$S" bash -c "rm -rf runs/acc_$a && mkdir -p runs && cp -r specstream_mlx/adapters/$a runs/acc_$a"
        step "$S" into $R/calibration_${a}_parent_vocab_amd_1205.json ./dev.sh specstream \
            calibrate --adapter runs/acc_$a --measure-acceptance --overwrite --suite "$t" --data "$D/$p" \
            --limit 48 --max-tokens 96 --json
        step "$S" ./dev.sh specstream bench --overwrite --suite "$t" --data "$D/$p" --limit 10 \
            --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --adapter "$a" \
            --json $R/bench_${t}_parent_vocab_amd_1205.json \
            --markdown $R/bench_${t}_parent_vocab_amd_1205.md
    done

    # == Streams that read their parent's token (issue 20) ==
    # the shipped `chat` (parent heads since 2026-12-04) scored on the 300 dev answers of
    # corpus shard dev-00001 (the first 300 usable; about 15 min), its acceptance on the chat
    # suite's items 40-87 on a copy (about 15 min) and the tree the planner picks here. Its
    # training is scripts/make_chat_adapter.sh's step 5 (about 50 min), not redone.
    S="Streams that read their parent's token"
    step "$S" ./dev.sh python scripts/corpus.py unpack --split dev --rows runs/dev_all.jsonl \
        --data-dir "$D"
    step "$S" ./dev.sh python -c 'import json
rows = [r for r in map(json.loads, open("runs/dev_all.jsonl")) if not r.get("degenerate")]
open("runs/dev300.jsonl", "w").writelines(json.dumps(r) + "\n" for r in rows[:300])'
    step "$S" ./dev.sh python benchmarks/validate_streams.py --adapter chat \
        --data runs/dev300.jsonl --json $R/stream_ablation/chat_parent.json
    step "$S" bash -c "rm -rf runs/acc_chat && mkdir -p runs && cp -r specstream_mlx/adapters/chat runs/acc_chat"
    step "$S" into $R/acceptance_chat_parent_items40_87.json ./dev.sh specstream calibrate \
        --adapter runs/acc_chat --measure-acceptance --overwrite --suite chat --data "$D" --limit 48 \
        --max-tokens 96 --json
    step "$S" into $R/calibration_chat_parent.json ./dev.sh specstream calibrate --adapter chat \
        --json

    # == Issue 18's CPU targets on an AMD instance ==
    # 9 interleaved rounds with the ratio's three factors (about 8 min), then the fused adapter's
    # plain decoding, six runs (about 7 min; their reports gathered into one file), then
    # the three writing tools side by side with mlx-lm (about 18 min)
    S="Issue 18's CPU targets on an AMD instance"
    step "$S" ./dev.sh python benchmarks/loop_overhead.py --rounds 9 \
        --json $R/loop_overhead_amd_1204.json
    for i in 1 2 3 4 5 6; do
        step "$S" ./dev.sh python benchmarks/fused_lora.py --cycles 5 --prompts 4 \
            --max-tokens 64 --json runs/fused_lora_amd_1204_r$i.json
    done
    step "$S" into $R/fused_lora_amd_1204.json python3 -c 'import json, sys
print(json.dumps({"runs": [json.load(open(f)) for f in sys.argv[1:]]}, indent=1))' \
        runs/fused_lora_amd_1204_r{1,2,3,4,5,6}.json
    writing_tools "$S" amd_1204

    # == The loop's overhead paired within rounds (issue 18) ==
    # 7 interleaved rounds, the target's ratio per round (about 6 min), then how soon
    # mx.async_eval returns (under a minute); the section's three loop variants and its
    # in-loop timers were throwaway probes (/work/runs/s50), not rerun
    S="The loop's overhead paired within rounds"
    step "$S" ./dev.sh python benchmarks/loop_overhead.py --rounds 7 \
        --json $R/loop_overhead_memstarved_1203.json
    step "$S" ./dev.sh python benchmarks/async_eval_return.py --rounds 5 \
        --json $R/async_eval_return_cpu_1203.json

    # == Qwen2.5-Coder-0.5B on the faster instance (issue 19) ==
    qwen_sql "Qwen2.5-Coder-0.5B on the faster instance" 1202

    # == A faster instance: the writing tools against mlx-lm, and ss+pld's passes on the device (issue 18) ==
    # the three writing tools side by side with mlx-lm (about 15 min), then grafted ss+pld
    # with and without device passes, paired on sql and dialogsum (about 10 min). The section's
    # host-vs-device probe of `ss` and its pass census were throwaway scripts, not rerun.
    S="A faster instance"
    writing_tools "$S" 1202
    for suite in "sql sql/dev.jsonl sql" "dialogsum dialogsum/dev.jsonl summarize"; do
        read -r t p a <<< "$suite"
        step "$S" ./dev.sh python benchmarks/grafted_lookup.py --adapter "$a" --suite "$t" \
            --data "$D/$p" --limit 8 --json $R/grafted_lookup_${t}_1202.json
    done

    # == The summarize tool's second round on its own answers (issue 20) ==
    # the shipped summarize's acceptance on items 40-75 on a copy (about 5 min), its quality on
    # items 0-39 (about 5 min) and its side-by-side bench (about 8 min). Its training (two
    # rounds of the tool's own answers, each about 40 min of distilling and 35 of training)
    # replaces the shipped adapter and is not redone, nor are the rows of the adapters it
    # replaced (section "The summarize tool learns its own answers").
    S="The summarize tool's second round on its own answers"
    step "$S" bash -c "rm -rf runs/own_summarize && mkdir -p runs && cp -r specstream_mlx/adapters/summarize runs/own_summarize"
    step "$S" into $R/acceptance_summarize_own2_items40_75.json ./dev.sh specstream calibrate \
        --adapter runs/own_summarize --measure-acceptance --overwrite --suite dialogsum \
        --data "$D/dialogsum/dev.jsonl" --limit 36 --max-tokens 96 --json
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --adapter summarize --methods ar --limit 40 --max-tokens 64 \
        --json $R/quality_dialogsum_summarize_own2.json
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --limit 10 --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --adapter summarize \
        --json $R/bench_dialogsum_summarize_own2.json --markdown $R/bench_dialogsum_summarize_own2.md

    # == Loops timed at the adapter's depth (issue 18) ==
    # the base model's curve (version 7, about 5 min), then chat and sql side by side (about 20)
    S="Loops timed at the adapter's depth"
    step "$S" into $R/calibration_v7_intel_1201.json ./dev.sh specstream calibrate --force --json
    for t in "chat $D chat" "sql $D/sql/dev.jsonl sql"; do
        read -r p B AB <<< "$t"
        step "$S" ./dev.sh specstream bench --overwrite --suite "$p" --data "$B" --limit 10 --max-tokens 96 \
            --methods ar,ss,pld,ss+pld,mlx-lm --adapter "$AB" --json $R/bench_${p}_v7_intel_1201.json \
            --markdown $R/bench_${p}_v7_intel_1201.md
    done

    # == The shipped chat on the same instance (issues 18 and 20) ==
    # the base model's curve measured afresh (about 3 min), the chat suite side by side (about 10),
    # then a pass's cost in 4 / 8 / 16 MSA layers (about 1.5 min)
    S="The shipped chat on the same instance"
    step "$S" into $R/calibration_fresh_curve_intel_1201.json ./dev.sh specstream calibrate \
        --force --json
    step "$S" ./dev.sh specstream bench --overwrite --suite chat --data "$D" --limit 10 --max-tokens 96 \
        --methods ar,ss,pld,ss+pld,mlx-lm --adapter chat --json $R/bench_chat_intel_1201.json \
        --markdown $R/bench_chat_intel_1201.md
    step "$S" ./dev.sh python benchmarks/msa_depth.py --json $R/msa_depth_intel_1201.json

    # == Qwen2.5-Coder-0.5B on today's loop and instance (issue 19) ==
    qwen_sql "Qwen2.5-Coder-0.5B on today's loop and instance" 1201

    # == The chat mix on both shards (issues 20 and 18) ==
    # the shipped chat side by side with mlx-lm on the chat suite (about 6 min); its training
    # and scoring are not redone (below)
    S="The chat mix on both shards"
    step "$S" ./dev.sh specstream bench --overwrite --suite chat --data "$D" --limit 10 --max-tokens 96 \
        --methods ar,ss,pld,ss+pld,mlx-lm --adapter chat --json $R/bench_chat_chatmix2700.json \
        --markdown $R/bench_chat_chatmix2700.md

    # == The writing tools on today's loop (issue 18) ==
    # each writing tool side by side with mlx-lm (about 3 min each), then the host-settled
    # compaction paired against the copying one on chat and sql (about 4 min each)
    S="The writing tools on today's loop"
    local ws wf wa
    for spec in "sql sql/dev.jsonl sql" "e2e e2e/dev.csv data2text" \
        "dialogsum dialogsum/dev.jsonl summarize"; do
        read -r ws wf wa <<<"$spec"
        step "$S" ./dev.sh specstream bench --overwrite --suite "$ws" --data "$D/$wf" --limit 10 \
            --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --adapter "$wa" \
            --json $R/bench_${ws}_intel_1129.json --markdown $R/bench_${ws}_intel_1129.md
    done
    step "$S" ./dev.sh python benchmarks/host_compaction.py --adapter chat --suite chat \
        --data "$D" --limit 10 --max-tokens 96 --json $R/host_compaction_chat.json
    step "$S" ./dev.sh python benchmarks/host_compaction.py --adapter sql --suite sql \
        --data "$D/sql/dev.jsonl" --limit 10 --max-tokens 96 --json $R/host_compaction_sql.json

    # == Compaction deferred by a pass (issue 18) ==
    # the loop's cost per pass with today's code (about 2.5 min; the "before" run needs the
    # code of a7c39df: below)
    S="Compaction deferred by a pass"
    step "$S" ./dev.sh python benchmarks/loop_overhead.py --json $R/loop_overhead_intel_kept.json

    # == Issue 18's table with a fresh latency curve ==
    # the curve measured again alone (about 3 min), then the three writing tools side by side
    # with mlx-lm (about 5-6 min each)
    S="Issue 18's table with a fresh latency curve"
    step "$S" bash -c "./dev.sh specstream calibrate --force --json > $R/calibration_fresh_curve.json"
    local fs ff
    for spec in "sql sql/dev.jsonl" "e2e e2e/dev.csv" "dialogsum dialogsum/dev.jsonl" \
        "sql_2 sql/dev.jsonl" "e2e_2 e2e/dev.csv"; do  # twice: ratios to mlx-lm swing
        read -r fs ff <<<"$spec"
        step "$S" ./dev.sh specstream bench --overwrite --suite "${fs%_2}" --data "$D/$ff" --limit 10 \
            --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_fresh_curve_$fs.json \
            --markdown $R/bench_fresh_curve_$fs.md
    done

    # == Lookup grafted onto the streams' tree (issue 18) ==
    # grafted against chains instead of the tree, paired, on the three writing tools (about 5
    # min each, dialogsum 2 rounds), then sql side by side with mlx-lm (about 5 min). The
    # section's simulation table (throwaway probes in /work/runs/s32) is not rerun.
    S="Lookup grafted onto the streams' tree"
    local ga gs gf gr
    for spec in "sql sql sql/dev.jsonl 1" "data2text e2e e2e/dev.csv 1" \
        "summarize dialogsum dialogsum/dev.jsonl 2"; do
        read -r ga gs gf gr <<<"$spec"
        step "$S" ./dev.sh python benchmarks/grafted_lookup.py --adapter "$ga" --suite "$gs" \
            --data "$D/$gf" --limit 10 --max-tokens 96 --rounds "$gr" \
            --json $R/grafted_lookup_$gs.json
    done
    for t in "" _2; do  # twice: the ratios against mlx-lm swing with the machine's speed
        step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --limit 10 \
            --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_grafted_sql$t.json \
            --markdown $R/bench_grafted_sql$t.md
    done
    step "$S" ./dev.sh python benchmarks/plain_vs_mlx_lm.py --rounds 5 \
        --json $R/plain_vs_mlx_lm_2026-11-28.json

    # == Trees planned by walking the acceptance trace (issue 18) ==
    # the writing tools' acceptance measured again with its trace on copies (about 10-20 min
    # each), walked against counted plans paired (about 7 min each), then the shipped adapters
    # side by side with mlx-lm (about 20 min). The section's first table (count-based gating,
    # commit 8d880f2) and its throwaway probes are not rerun.
    S="Trees planned by walking the acceptance trace"
    local wa ws wf wl
    for spec in "sql sql sql/dev.jsonl 48" "data2text e2e e2e/dev.csv 48" \
        "summarize dialogsum dialogsum/dev.jsonl 36"; do
        read -r wa ws wf wl <<<"$spec"
        step "$S" bash -c "rm -rf runs/walk_$wa && mkdir -p runs && cp -r specstream_mlx/adapters/$wa runs/walk_$wa"
        step "$S" ./dev.sh specstream calibrate --adapter "runs/walk_$wa" --measure-acceptance --overwrite \
            --data "$D/$wf" --limit "$wl" --max-tokens 96
        step "$S" ./dev.sh python benchmarks/walked_trees.py --adapter "runs/walk_$wa" \
            --suite "$ws" --data "$D/$wf" --limit 10 --max-tokens 96 --json $R/walked_trees_$ws.json
    done
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --limit 10 \
        --max-tokens 96 --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_walked_sql.json \
        --markdown $R/bench_walked_sql.md
    for spec in "e2e e2e/dev.csv" "dialogsum dialogsum/dev.jsonl"; do
        read -r ws wf <<<"$spec"
        step "$S" ./dev.sh specstream bench --overwrite --suite "$ws" --data "$D/$wf" --limit 10 \
            --max-tokens 96 --methods ar,ss,mlx-lm --json $R/bench_walked_$ws.json \
            --markdown $R/bench_walked_$ws.md
    done

    # == The README's table, and where ss+pld's passes go (issues 18 and 20) ==
    # the curve measured again (about 2.5 min), the chat suite and the sql dev set side by side
    # (about 6 min each), then the sql dev set's passes grouped by tree size (about 2 min)
    S="The README's table and a pass trace"
    side_by_side "$S" readme
    step "$S" ./dev.sh python benchmarks/pass_trace.py --suite sql --data "$D/sql/dev.jsonl" \
        --adapter sql --json $R/pass_trace_sql.json

    # == Qwen2.5-Coder-0.5B: the sql writing tool (issue 19) ==
    # the shipped Qwen `sql` (lossless: scripts/make_qwen_sql_adapter.sh, three rounds since 2026-12-05, about 3.3 h, not rerun
    # here): its acceptance on the sql dev items 40-87 (acceptance.json, about 10 min), the tree
    # the planner picks (Qwen's curve in $QC: measured first if missing, about 4 min), then the
    # sql dev set side by side (about 12 min). The shared-mode run of the section (not shipped)
    # is a one-off command given there.
    S="Qwen2.5-Coder-0.5B: the sql writing tool (issue 19)"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream calibrate --model "$QWEN" \
        --adapter sql --measure-acceptance --overwrite --suite sql --data "$D/sql/dev.jsonl" --limit 48 \
        --max-tokens 96
    step "$S" into $R/calibration_qwen_sql.json env SPECSTREAM_CACHE="$QC" ./dev.sh specstream \
        calibrate --model "$QWEN" --adapter sql --json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite sql \
        --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter sql \
        --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_sql_adapter.json \
        --markdown $R/bench_qwen_sql_adapter.md

    # == Prompt lookup gated by the latency curve (issues 19 and 18) ==
    # the gated pld (and ss+pld) on the chat suite and the sql dev set, SmolLM2 (about 2 and 3
    # min) and Qwen (its curve first, in $QC: about 4 min, then about 5 min). The rows "whole
    # chains" of the section are the code before the gate (commit b84eb70), not rerun here.
    S="Prompt lookup gated by the latency curve (issues 19 and 18)"
    step "$S" ./dev.sh specstream bench --overwrite --suite chat --data "$D" --limit 16 --max-tokens 64 \
        --methods ar,pld --json $R/bench_gate_smol_chat.json
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --adapter sql \
        --methods ar,pld,ss+pld --limit 10 --max-tokens 96 --json $R/bench_gate_smol_sql.json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream calibrate --model "$QWEN"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite chat \
        --data "$D" --limit 16 --max-tokens 64 --methods ar,pld --json $R/bench_gate_qwen_chat.json

    # == The data2text writing tool retrained on 3,000 examples (issue 20) ==
    # the shipped data2text (scripts/make_task_adapter.sh data2text, about 80 min, not rerun
    # here): its acceptance on dev items 40-51 (about 1 min), the side-by-side bench on items
    # 0-9 (about 2 min) and its quality on items 0-39 (about 2 min); the baseline's quality
    # needs runs/data2text_next_token (`scripts/make_task_adapter.sh data2text --baseline-only`,
    # about 30 min), run by hand
    S="Acceptance counted at every position; summarize with LoRA in the top 8 blocks (issues 20 and 18)"
    # per-position acceptance on copies of the shipped folders (theirs stay), then both trees
    for pair in sql:sql/dev.jsonl data2text:e2e/dev.csv; do
        a=${pair%%:*} f=${pair#*:} suite=$([ "$a" = sql ] && echo sql || echo e2e)
        step "$S" bash -c "rm -rf runs/acc_$a && mkdir -p runs && cp -r specstream_mlx/adapters/$a runs/acc_$a"
        step "$S" ./dev.sh specstream calibrate --adapter "runs/acc_$a" --measure-acceptance --overwrite \
            --suite "$suite" --data "$D/$f" --limit 12 --max-tokens 96
        step "$S" ./dev.sh specstream bench --overwrite --suite "$suite" --data "$D/$f" --adapter "runs/acc_$a" \
            --methods ar,ss,ss+pld,mlx-lm --limit 10 --max-tokens 96 \
            --json $R/bench_${suite}_acceptance_per_position.json
        step "$S" ./dev.sh specstream bench --overwrite --suite "$suite" --data "$D/$f" --adapter "$a" \
            --methods ar,ss,ss+pld,mlx-lm --limit 10 --max-tokens 96 \
            --json $R/bench_${suite}_acceptance_per_pass.json
    done
    step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --adapter summarize --methods ar --limit 40 --max-tokens 64 \
        --json $R/quality_dialogsum_shipped.json
    # the top-8 summarize run (runs/sum_v2, about 2.2 h of training here) is not retrained by
    # this script: its command is in BENCHMARKS.md; with runs/sum_v2 present:
    if [ -d runs/sum_v2 ]; then
        step "$S" ./dev.sh specstream calibrate --adapter runs/sum_v2 --measure-acceptance --overwrite \
            --suite dialogsum --data "$D/dialogsum/dev.jsonl" --limit 12 --max-tokens 96
        step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
            --adapter runs/sum_v2 --methods ar,ss,pld,ss+pld,mlx-lm --limit 10 --max-tokens 96 \
            --json $R/bench_dialogsum_top8.json --markdown $R/bench_dialogsum_top8.md
        step "$S" ./dev.sh specstream bench --overwrite --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
            --adapter runs/sum_v2 --methods ar --limit 40 --max-tokens 64 \
            --json $R/quality_dialogsum_top8.json
    fi

    S="The data2text writing tool retrained on 3,000 examples (issue 20)"
    step "$S" ./dev.sh specstream calibrate --adapter data2text --measure-acceptance --overwrite --suite e2e \
        --data "$D/e2e/dev.csv" --limit 12 --max-tokens 96
    step "$S" ./dev.sh specstream bench --overwrite --suite e2e --data "$D/e2e/dev.csv" --adapter data2text \
        --methods ar,ss,pld,ss+pld,mlx-lm --limit 10 --max-tokens 96 \
        --json $R/bench_e2e_3000.json --markdown $R/bench_e2e_3000.md
    step "$S" ./dev.sh specstream bench --overwrite --suite e2e --data "$D/e2e/dev.csv" --adapter data2text \
        --methods ar,mlx-lm --limit 40 --max-tokens 64 --json $R/quality_e2e_3000_shipped.json

    # == The sql writing tool retrained on 3,000 examples (issues 20 and 18) ==
    # the shipped sql adapter (scripts/make_task_adapter.sh sql, about 65 min, not rerun here):
    # the curve again, its acceptance on dev items 40-51 (about 2 min), then the side-by-side
    # bench on items 0-9 (about 3 min)
    S="The sql writing tool retrained on 3,000 examples (issues 20 and 18)"
    step "$S" ./dev.sh specstream calibrate --force --adapter sql
    step "$S" ./dev.sh specstream calibrate --adapter sql --measure-acceptance --overwrite --suite sql \
        --data "$D/sql/dev.jsonl" --limit 48 --max-tokens 96
    step "$S" ./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --adapter sql \
        --methods ar,ss,pld,ss+pld,mlx-lm --limit 10 --max-tokens 96 \
        --json $R/bench_sql_3000.json --markdown $R/bench_sql_3000.md

    # == Qwen2.5-Coder-0.5B-Instruct: correctness against llama.cpp (issue 19) ==
    # ours only (one forward per length, plus the GGUF conversion into $QC: about 30 s)
    S="Qwen2.5-Coder-0.5B: correctness against llama.cpp (issue 19)"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh python benchmarks/perplexity.py --model "$QWEN"

    # == Qwen2.5-Coder-0.5B: load time and latency curve (issue 19) ==
    # twice from an empty cache (about 25 s each), three times from the filled one (about 5 s
    # each), then the latency curve (209 s)
    S="Qwen2.5-Coder-0.5B: load time and latency curve (issue 19)"
    step "$S" qwen_load fresh
    step "$S" qwen_load fresh
    step "$S" qwen_load cached
    step "$S" qwen_load cached
    step "$S" qwen_load cached
    step "$S" qwen_calibrate

    # == Qwen2.5-Coder-0.5B with trained streams (issue 19) ==
    # the shipped Qwen `chat` streams (scripts/make_qwen_chat_adapter.sh): their acceptance on the
    # chat suite's items 40-51 (acceptance.json, about 8 min), the tree the planner picks from it
    # and the curve above, then the chat suite and the sql dev set side by side (about 20 and 15
    # min; no Qwen `sql` adapter yet: ss and ss+pld draft with the chat streams there)
    S="Qwen2.5-Coder-0.5B with trained streams (issue 19)"
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream calibrate --model "$QWEN" \
        --adapter chat --measure-acceptance --overwrite --data "$D" --limit 12 --max-tokens 96
    step "$S" into $R/calibration_qwen_chat.json env SPECSTREAM_CACHE="$QC" ./dev.sh specstream \
        calibrate --model "$QWEN" --adapter chat --json
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite chat \
        --data "$D" --limit 16 --max-tokens 64 --methods ar,ss,pld,ss+pld,mlx-lm \
        --json $R/bench_qwen_chat.json --markdown $R/bench_qwen_chat.md
    step "$S" env SPECSTREAM_CACHE="$QC" ./dev.sh specstream bench --overwrite --model "$QWEN" --suite sql \
        --data "$D/sql/dev.jsonl" --limit 16 --max-tokens 64 --adapter chat \
        --methods ar,ss,pld,ss+pld,mlx-lm --json $R/bench_qwen_sql.json --markdown $R/bench_qwen_sql.md

    # == One decoding loop, passes settled on the device, fused LoRA (issue 18) ==
    # ### What a pass costs in the loop (unknown)
    S="One decoding loop: what a pass costs in the loop (issue 18)"
    step "$S" ./dev.sh python benchmarks/loop_overhead.py --rounds 5 --json $R/loop_overhead.json
    step "$S" ./dev.sh python benchmarks/async_probe.py
    # ### Shared adapters fused (unknown)
    S="One decoding loop: shared adapters fused (issue 18)"
    step "$S" ./dev.sh python benchmarks/fused_lora.py --cycles 5 --prompts 4 --max-tokens 64 \
        --json $R/fused_lora.json
    step "$S" ./dev.sh python benchmarks/shared_step.py --adapter sql --rounds 9 --json $R/shared_step.json
    step "$S" ./dev.sh python benchmarks/shared_step.py --adapter sql --precision q8 --rounds 5 \
        --steps 50 --json $R/shared_step_q8.json
    # ### Decoders against plain decoding and mlx-lm (calibration about 1 min; benches unknown)
    S="One decoding loop: decoders against plain decoding and mlx-lm (issue 18)"
    side_by_side "$S" loop
    B=(./dev.sh specstream bench --overwrite --limit 10 --max-tokens 96)
    step "$S" "${B[@]}" --suite dialogsum --data "$D/dialogsum/dev.jsonl" --methods ar,ss,mlx-lm \
        --json $R/bench_loop_dialogsum.json --markdown $R/bench_loop_dialogsum.md
    step "$S" "${B[@]}" --suite e2e --data "$D/e2e/dev.csv" --methods ar,ss,mlx-lm \
        --json $R/bench_loop_e2e.json --markdown $R/bench_loop_e2e.md

    # == Hardware tuning: calibrated trees, compiled steps, precision (issue 9) ==
    # benchmarks/tuning_sweep.sh's commands one by one (about an hour in all), with
    # scripts/measure_acceptance.sh where the document has the acceptance statistics (unknown)
    # ### This device's latency curve and decoding-loop costs (65 s)
    S="Hardware tuning: this device's latency curve (issue 9)"
    step "$S" into $R/calibration.json ./dev.sh specstream calibrate --force --adapter chat --json
    # ### Where a step's time goes, and what compiling changes
    S="Hardware tuning: where a step's time goes (issue 9)"
    step "$S" into $R/step_profile.md ./dev.sh python benchmarks/step_profile.py \
        --json $R/step_profile.json
    step "$S" into $R/step_profile_sql.md ./dev.sh python benchmarks/step_profile.py \
        --adapter sql --paths "0;1" --json $R/step_profile_sql.json
    # ### Acceptance statistics and the trees chosen here (rewrites the shipped adapters'
    # acceptance.json; then each adapter's tree as calibrate prints it)
    S="Hardware tuning: acceptance statistics and trees (issue 9)"
    step "$S" scripts/measure_acceptance.sh
    step "$S" ./dev.sh specstream calibrate --adapter chat
    step "$S" ./dev.sh specstream calibrate --adapter summarize
    step "$S" ./dev.sh specstream calibrate --adapter data2text
    step "$S" ./dev.sh specstream calibrate --adapter sql
    # ### Tuned decoders against plain decoding and mlx-lm
    S="Hardware tuning: tuned decoders (issue 9)"
    B=(./dev.sh specstream bench --overwrite --methods ar,ss,ss+pld,mlx-lm --limit 10 --max-tokens 96)
    step "$S" "${B[@]}" --suite chat --data "$D" --json $R/tuned_chat.json --markdown $R/tuned_chat.md
    step "$S" "${B[@]}" --suite dialogsum --data "$D/dialogsum/dev.jsonl" \
        --json $R/tuned_dialogsum.json --markdown $R/tuned_dialogsum.md
    step "$S" "${B[@]}" --suite e2e --data "$D/e2e/dev.csv" \
        --json $R/tuned_e2e.json --markdown $R/tuned_e2e.md
    step "$S" "${B[@]}" --suite sql --data "$D/sql/dev.jsonl" \
        --json $R/tuned_sql.json --markdown $R/tuned_sql.md
    # ### Precision (the shape of the paper's Table 4)
    S="Hardware tuning: precision (issue 9)"
    B=(./dev.sh specstream bench --overwrite --suite sql --data "$D/sql/dev.jsonl" --methods ar,ss --tree adapter
        --limit 4 --max-tokens 48)
    step "$S" "${B[@]}" --precision float32 --json $R/precision_sql_float32.json \
        --markdown $R/precision_sql_float32.md
    step "$S" "${B[@]}" --precision q8 --json $R/precision_sql_q8.json \
        --markdown $R/precision_sql_q8.md
    step "$S" "${B[@]}" --precision stored --json $R/precision_sql_stored.json \
        --markdown $R/precision_sql_stored.md

    # == Sampling with the speculative decoders (issue 8) ==
    # benchmarks/sampling_sweep.sh's commands one by one (about 30 minutes in all)
    S="Sampling with the speculative decoders (issue 8)"
    B=(./dev.sh specstream bench --overwrite --max-tokens 64 --methods ar,ss,ss+pld)
    for t in 0 0.7 1.0; do
        step "$S" "${B[@]}" --suite chat --data "$D" --limit 16 --temp $t \
            --json $R/sampling_chat_t$t.json --markdown $R/sampling_chat_t$t.md
    done
    for t in 0 0.7 1.0; do
        step "$S" "${B[@]}" --suite sql --data "$D/sql/dev.jsonl" --limit 20 --temp $t \
            --json $R/sampling_sql_t$t.json --markdown $R/sampling_sql_t$t.md
    done

    # == The PyTorch path: parity with MLX (issue 7) == (unknown; the CUDA table: see the end)
    S="The PyTorch path: parity with MLX (issue 7)"
    step "$S" into $R/torch_parity.json ./dev.sh python benchmarks/torch_parity.py --max-tokens 48
    # "The eighth lease": the taus each sized tree's acceptance statistics promise, read
    # against that lease's reports (seconds; the reports themselves need a GPU)
    step "$S" ./dev.sh python benchmarks/predicted_tau.py \
        sql $R/cuda_h200_sql_sql_trees_f55ba5a.json chat $R/cuda_h200_chat_chat_trees_f55ba5a.json \
        data2text $R/cuda_h200_data2text_e2e_trees_f55ba5a.json \
        summarize $R/cuda_h200_summarize_dialogsum_trees_f55ba5a.json

    # == Side by side: `specstream bench` (issue 5) ==
    # the comparators' folders first when missing (each about an hour; data2text's 760 s), then
    # one bench per suite (unknown), then the generated tables (scripts/bench_tables.py, given
    # these four reports: with no arguments it would also take in bench_loop_*.json)
    S="Side by side: specstream bench --overwrite (issue 5)"
    step "$S" ensure runs/summarize_next_token scripts/make_task_adapter.sh summarize --baseline-only
    step "$S" ensure runs/data2text_next_token scripts/make_task_adapter.sh data2text --baseline-only
    step "$S" ensure runs/sql_next_token scripts/make_task_adapter.sh sql --baseline-only
    step "$S" ensure runs/medusa_sql scripts/make_medusa.sh sql
    B=(./dev.sh specstream bench --overwrite --max-tokens 64)
    step "$S" "${B[@]}" --suite chat --data "$D" --limit 16 --methods ar,ss,pld,ss+pld,mlx-lm \
        --adapter chat --json $R/bench_chat.json --plot $R/bench_chat.png
    step "$S" "${B[@]}" --suite dialogsum --data "$D/dialogsum/dev.jsonl" --limit 20 \
        --methods ar,ss,pld,ss+pld,mlx-lm,lora --adapter summarize --lora runs/summarize_next_token \
        --json $R/bench_dialogsum.json --plot $R/bench_dialogsum.png
    step "$S" "${B[@]}" --suite e2e --data "$D/e2e/dev.csv" --limit 20 \
        --methods ar,ss,pld,ss+pld,mlx-lm,lora --adapter data2text --lora runs/data2text_next_token \
        --json $R/bench_e2e.json --plot $R/bench_e2e.png
    step "$S" "${B[@]}" --suite sql --data "$D/sql/dev.jsonl" --limit 40 \
        --methods ar,ss,pld,ss+pld,mlx-lm,lora,medusa --adapter sql --medusa runs/medusa_sql \
        --lora runs/sql_next_token --json $R/bench_sql.json --plot $R/bench_sql.png
    step "$S" ./dev.sh python scripts/bench_tables.py $R/bench_chat.json $R/bench_dialogsum.json \
        $R/bench_e2e.json $R/bench_sql.json

    # == Plain decoding: specstream `ar` vs mlx-lm (issue 2) ==
    # the benchmark (unknown), then mlx-lm's own CLI on the two exports (a minute or two)
    S="Plain decoding: specstream ar vs mlx-lm (issue 2)"
    step "$S" ./dev.sh python benchmarks/plain_vs_mlx_lm.py --max-tokens 128 --rounds 5 \
        --json $R/plain_vs_mlx_lm.json
    step "$S" ./dev.sh specstream export-model --out runs/mlx_export_stored --overwrite
    step "$S" ./dev.sh mlx_lm.generate --model runs/mlx_export_stored --prompt "$STORY" --max-tokens 128
    step "$S" ./dev.sh specstream export-model --out runs/mlx_export_float32 --dtype float32 --overwrite
    step "$S" ./dev.sh mlx_lm.generate --model runs/mlx_export_float32 --prompt "$STORY" --max-tokens 128

    # == Adapter manager and server (issue 6) == (unknown; the server load about 2.5 min)
    S="Adapter manager and server (issue 6)"
    step "$S" ./dev.sh python benchmarks/adapter_swap.py --rounds 20 --json $R/adapter_swap.json
    step "$S" ./dev.sh python benchmarks/adapter_swap.py --rounds 20 --no-keep-fused \
        --json $R/adapter_swap_lean.json
    step "$S" ./dev.sh python benchmarks/server_load.py --requests 50 --max-tokens 48 --data "$D" \
        --json $R/server_load.json

    # == The Quickstart command (issue 4) == (seconds each)
    S="The Quickstart command (issue 4)"
    B=(./dev.sh specstream generate --adapter chat)
    step "$S" "${B[@]}" --decoder ss+pld --compare --prompt "$EIFFEL"
    step "$S" "${B[@]}" --decoder ss+pld --compare --json --prompt "$EIFFEL"
    for p in "Explain how a bicycle works, step by step." \
        "Write a short story about a robot who learns to paint."; do
        step "$S" "${B[@]}" --decoder ss+pld --max-tokens 128 --compare --prompt "$p"
        step "$S" "${B[@]}" --decoder ss --max-tokens 128 --compare --prompt "$p"
    done

    # == Forward latency vs tokens processed at once (issue 2) == (unknown)
    S="Forward latency vs tokens processed at once (issue 2)"
    step "$S" ./dev.sh python benchmarks/latency_curve.py --repeats 10 \
        --json $R/latency_curve_float32.json
    step "$S" ./dev.sh python benchmarks/latency_curve.py --precision stored --repeats 5 \
        --json $R/latency_curve_stored.json

    # == Default-model perplexity (issue 2) == (ours only; seconds)
    S="Default-model perplexity (issue 2)"
    step "$S" ./dev.sh python benchmarks/perplexity.py

    # == Speculative Streaming before training: overhead and ceiling (issue 3) == (unknown)
    S="Speculative Streaming before training (issue 3)"
    step "$S" ./dev.sh python benchmarks/speculative_overhead.py --max-tokens 64 --rounds 2 \
        --json $R/speculative_overhead.json

    # == Trained stream adapters (issue 4) ==
    # decoding with `chat` (unknown)
    S="Trained stream adapters: decoding with chat (issue 4)"
    B=(./dev.sh python benchmarks/adapter_speed.py)
    step "$S" "${B[@]}" --adapter chat --prompts 8 --max-tokens 48 --trees 1x2,1x3,1x5,2x8 \
        --json $R/adapter_speed_chat.json
    step "$S" "${B[@]}" --adapter chat --prompts 16 --max-tokens 64 --trees 1x2,1x3 \
        --json $R/adapter_speed_chat_16x64.json
    # writing tools, speed and quality (unknown); today's adapters, see the end
    S="Trained stream adapters: writing tools (issue 4)"
    step "$S" ensure runs/data2text_next_token scripts/make_task_adapter.sh data2text --baseline-only
    step "$S" "${B[@]}" --adapter data2text --task data2text --prompts 8 --max-tokens 64 \
        --trees 1x2,1x5 --baseline runs/data2text_next_token --json $R/adapter_speed_data2text.json
    step "$S" "${B[@]}" --adapter data2text --task data2text --prompts 40 --max-tokens 64 \
        --trees none --baseline runs/data2text_next_token --json $R/quality_data2text_40.json
    step "$S" ensure runs/sql_next_token scripts/make_task_adapter.sh sql --baseline-only
    step "$S" "${B[@]}" --adapter sql --task sql --prompts 8 --max-tokens 48 --trees 1x2,1x5 \
        --baseline runs/sql_next_token --json $R/adapter_speed_sql.json
    step "$S" "${B[@]}" --adapter sql --task sql --prompts 40 --max-tokens 64 --trees none \
        --baseline runs/sql_next_token --json $R/quality_sql_40.json

    # ### Why the lossless streams learned so little, and what changed (issue 4)
    # the distilled chat rows first when missing (step 1 of scripts/make_chat_adapter.sh, about
    # 40 min; not its training, which would replace the shipped adapter), then one diagnostic per
    # row of the table, each run to 160 steps (8-10 min each), and --steps 320 (16 min)
    S="Trained stream adapters: why the lossless streams learned so little (issue 4)"
    step "$S" ensure runs/chat_distill.jsonl ./dev.sh specstream distill --chat-prompts 640 --mix-kinds all --seed 0 \
        --data-dir "$D" --max-tokens 160 --batch-size 32 --out runs/chat_distill.jsonl
    MEM=(./dev.sh python benchmarks/stream_memorise.py --data runs/chat_distill.jsonl --rows 8)
    step "$S" "${MEM[@]}" --steps 160 --lr 3e-3 --plain-adapter-lr
    step "$S" "${MEM[@]}" --steps 160 --lr 3e-2 --plain-adapter-lr
    step "$S" "${MEM[@]}" --steps 160 --lr 3e-3
    step "$S" "${MEM[@]}" --steps 160 --lr 1e-3
    step "$S" "${MEM[@]}" --steps 160 --lr 1e-2
    step "$S" "${MEM[@]}" --steps 160 --lr 3e-3 --rank 64
    step "$S" "${MEM[@]}" --steps 160 --lr 3e-3 --msa-layers 8
    step "$S" "${MEM[@]}" --steps 160 --lr 3e-3 --msa-layers 12
    step "$S" "${MEM[@]}" --steps 320 --lr 3e-3

    # ### Shared mode: streams with their own adapters (issue 4)
    # the three 40-step A/B trainings one after the other (unknown; the document ran them side
    # by side), into runs/ab_shared_*; the figures are their validation lines
    S="Trained stream adapters: shared mode, streams with their own adapters (issue 4)"
    AB=(./dev.sh specstream train --mode shared --task data2text --data "$D/e2e/train.csv" --steps 40
        --batch-size 4 --max-length 256 --lora-rank 8 --lora-lr 5e-5 --warmup 10 --seed 0 --gamma 4
        --tree-top-k 3 --lr 3e-3 --val-every 40 --overwrite)
    step "$S" "${AB[@]}" --msa-layers 4 --no-stream-adapters --out runs/ab_shared_lora_only
    step "$S" "${AB[@]}" --msa-layers 4 --out runs/ab_shared_own_adapters_4
    step "$S" "${AB[@]}" --msa-layers 8 --out runs/ab_shared_own_adapters_8
}

mode=count
steps
N=$n
if [ "$DRY_RUN" != 1 ]; then
    [ -d "$D" ] || { echo "no data folder at $D (set SPECSTREAM_DATA)" >&2; exit 1; }
    ./dev.sh true  # the virtualenv, set up before the first timing
    mkdir -p runs
fi
n=0
mode=run
steps
if [ "$DRY_RUN" = 1 ]; then
    echo "dry run: nothing was run"
else
    echo "done: docs/results/ and the bench tables of docs/BENCHMARKS.md rewritten; update the other tables from the log"
fi

# ---- not regenerated here: why ----------------------------------------------------------------
# - "What limits the lossless streams" (issue 20's curves and ablation rows): each row is a
#   training run of 25 minutes to 2 hours here; `scripts/stream_ablation.sh` (ROWS=...) trains
#   and scores them into ../runs/ablation/ROW.json, copied to $R/stream_ablation/, and
#   `./dev.sh python benchmarks/plot_streams.py --runs ../runs/ablation` redraws docs/plots/.
# - "The planner charges a tree per confidence bin": its old rows (gated_price_*_old*.json; the
#   chat row is the 12:15 run quoted in the section, its JSON not kept) ran
#   the code of a6cfa51 (`git worktree add ../wt a6cfa51`, its own SPECSTREAM_CACHE so that it
#   measures its version-7 curve), with the section's commands.
# - Sections that bench the shipped writing tools (writing_tools and the like) run today's: since
#   2026-12-07 sql's and data2text's main streams ignore their streams (summarize's since
#   2026-12-06), so their `ar` rows in sections measured before come out faster, and sql is the
#   packed adapter since later that day (other answers, slower streams). The adapters of
#   then: `git archive e95a6ed specstream_mlx/adapters/A` (5523dee for summarize; 3ebd52d for
#   sql's main-ignores one).
# - The llama.cpp columns (Qwen and default-model perplexity, tests/golden/*llamacpp_reference.json):
#   scripts/llamacpp_reference.py needs llama-cpp-python built from source, which is not in
#   .venv (not a dependency of the project), and its output is a pinned test reference.
# - Issue 18's A/B of the old loop against the new one: /tmp/ab_spec.py was not kept (old code
#   at 41a5003).
# - "Compaction deferred by a pass": the "before" column is loop_overhead.py at commit a7c39df
#   (git worktree it to rerun), and the buffer-copy probes (/work/runs/s38/donate*.py) were not
#   kept. "The chat mix on both shards": its training (scripts/make_chat_adapter.sh, about 3
#   hours here for its three rounds) and scoring replace the shipped adapter and are not redone;
#   nor "The fourth chat round ships" (its round: 2 hours here; the scoring commands are in
#   BENCHMARKS.md), nor the msa_micro / pass_probe probes of "Loops timed at the adapter's
#   depth" (/work/runs/s40, not kept).
# - "The summarize tool's third round on its own answers": its adapter (../runs/s44/sum3, about
#   an hour and a half to remake with the section's command) was not shipped nor kept.
# - Issue 7's CUDA figures: need a lent GPU (scripts/cuda_validate.sh prepare, one device call
#   per part runs/cuda1..N, the last running `run ADAPTER SUITE`; BENCHMARKS's PyTorch section
#   names each lease's commands). Likewise every "not measured" Apple Silicon remark.
# - Issue 5's one-off comparison of how to combine the streams' and the lookup's drafts: the
#   code variants were not kept.
# - Issue 3's per-piece profile of a chain step (tree_forward pieces timed separately): one-off,
#   no script kept.
# - Issue 4's training runs (scripts/make_chat_adapter.sh, scripts/make_task_adapter.sh TASK):
#   they replace the shipped adapters and take about an hour each; so their validation tables
#   (written into the adapters) and the trainer throughput (medians of runs/*.log) are not
#   redone, nor the "previous recipe" / "previous adapter" rows (those adapters are not kept).
# - Issue 4's "Cheaper passes" figures: measured at intermediate states of the code, never
#   committed.
# - Issue 4's writing-tool tables (adapter_speed_sql, quality_sql_40, adapter_speed_data2text,
#   quality_data2text_40): measured on the adapters shipped before their retraining (sql before
#   063f1d3, data2text before 8c67d98); the steps above rerun the same commands on today's
#   adapters, so their figures will differ from the document's.
# - Issue 20's "before" rows of the retrained sql and data2text (bench_*_before_3000.json,
#   quality_*_3000_before.json) and the gate's "whole chains" rows (bench_gate_*_whole.json):
#   adapters and code that are no longer current (sql and data2text before 2026-11-26; the
#   lookup before commit 1deedf0).
# - The Quickstart's earlier runs (before the float32 dequantization and before issue 9's
#   tuning): older states of the code.
# - "Parent heads as float16": its comparison needs the float32-head adapters of commit e84f289
#   (`git show e84f289:specstream_mlx/adapters/NAME/...` into a folder); each side's command
#   (`calibrate --measure-acceptance --overwrite` on a copy, then benchmarks/compare_acceptance.py) is in
#   the section. The shipped acceptance.json files are remade by scripts/measure_acceptance.sh.
