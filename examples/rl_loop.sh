#!/usr/bin/env bash
# GRPO on the bundled arith workload: E epochs of  rollout -> pack -> train,  then a last rollout
# with the final checkpoint, and a report (examples/rl_report.py: report.md, reward.png,
# accepted.png, metrics.json in the run directory).
#
#   examples/rl_loop.sh [RUN_DIR]                  # default RUN_DIR: runs/arith
#   EPOCHS=3 K=8 LR=3e-4 examples/rl_loop.sh runs/x
#   MODEL=examples/agent/model TOOLS=examples/agent/tools.py:TOOLS examples/rl_loop.sh runs/agent
#   examples/smollm2/rl_loop.sh [RUN_DIR]          # the real model (its settings, then this script)
#
# The tree cache (RUN_DIR/cache, or $CACHE) is kept across epochs and across invocations:
# kill the script and start it again with the same RUN_DIR and it continues where it stopped
# (finished stages are skipped, a half-written pool is resumed, training resumes from its last
# checkpoint) with the cache warm. Each stage's JSON summary is written only when it succeeds.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
RUN="${1:-runs/arith}"
EPOCHS="${EPOCHS:-3}"            # training epochs; epoch EPOCHS is a rollout-only epoch
K="${K:-8}"                      # samples per prompt (the GRPO group)
EVAL_K="${EVAL_K:-4}"
PROMPTS="${PROMPTS:-$HERE/arith/prompts.jsonl}"
EVAL="${EVAL:-$HERE/arith/eval.jsonl}"
LR="${LR:-3e-4}"                 # 1e-3 raised reward for one epoch, then collapsed it (measured)
BATCH="${BATCH:-128}"            # steps (model turns) per optimizer step
PACK_TOKENS="${PACK_TOKENS:-2048}"  # real tokens per packed row: ~17 rows, ~10 optimizer steps an epoch
MAX_NEW="${MAX_NEW:-96}"
CACHE="${CACHE:-$RUN/cache}"
DRAFT="${DRAFT:-srt}"
TOOLS="${TOOLS-calculator}"      # --tools: a built-in name or FILE.py:NAME (examples/agent/tools.py:TOOLS); empty: none
REWARD="${REWARD:-exact_match}"  # --reward: a built-in name or FILE.py:NAME
TEMPERATURE="${TEMPERATURE:-1.0}"
TRAIN_ARGS="${TRAIN_ARGS:-}"     # more `srt train` flags, e.g. --gradient-checkpointing

if [[ -z "${SRT:-}" ]]; then
  if command -v srt >/dev/null; then SRT=srt; else SRT="$ROOT/.venv/bin/srt"; fi
fi
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
MODEL0="${MODEL:-$("$PYTHON" -c 'from srtcli.models import default_model_dir; print(default_model_dir())')}"

mkdir -p "$RUN"
CMDS="$RUN/commands.txt"
[[ -f "$CMDS" ]] || echo "# $(date -u +%FT%TZ) examples/rl_loop.sh $RUN  (EPOCHS=$EPOCHS K=$K EVAL_K=$EVAL_K LR=$LR BATCH=$BATCH PACK_TOKENS=$PACK_TOKENS MODEL=$MODEL0 REWARD=$REWARD)" > "$CMDS"
tools=()
[[ -n "$TOOLS" ]] && tools=(--tools "$TOOLS")
read -r -a train_args <<< "$TRAIN_ARGS"

# run OUT.json CMD...: run CMD, keep its last stdout line (the --json object) in OUT.json.
run() {
  local out="$1"; shift
  if [[ -s "$out" ]]; then echo "skip (done): $*" >&2; return; fi
  echo "$*" >> "$CMDS"
  echo "+ $*" >&2
  "$@" | tail -n 1 > "$out.tmp"
  mv "$out.tmp" "$out"
}

rollout() {  # rollout PROMPTS MODEL N CACHE POOL_DIR SEED OUT.json
  local resume=()
  [[ -f "$5/rollout.jsonl" ]] && resume=(--resume)
  run "$7" "$SRT" rollout --prompts "$1" --model "$2" -n "$3" --cache "$4" --out "$5" --seed "$6" \
    "${tools[@]}" --reward "$REWARD" --draft "$DRAFT" --max-new-tokens "$MAX_NEW" --temperature "$TEMPERATURE" \
    "${resume[@]}" --json
}

model="$MODEL0"
for ((e = 0; e <= EPOCHS; e++)); do
  d="$RUN/epoch-$e"
  mkdir -p "$d"
  start=$(date +%s)
  rollout "$PROMPTS" "$model" "$K" "$CACHE" "$d/pool" "$e" "$d/rollout.json"
  # Eval prompts get their own cache so they never warm the training prompts' trees.
  rollout "$EVAL" "$model" "$EVAL_K" "$RUN/eval-cache" "$d/eval-pool" "$((1000 + e))" "$d/eval.json"
  if ((e < EPOCHS)); then
    run "$d/pack.json" "$SRT" pack --steps "$d/pool" --out "$d/shards" --max-tokens "$PACK_TOKENS" --overwrite --json
    resume=()
    [[ -d "$d/ckpt" ]] && resume=(--resume)
    run "$d/train.json" "$SRT" train --shards "$d/shards" --model "$model" --out "$d/ckpt" \
      --lr "$LR" --batch-size "$BATCH" --seed "$e" "${train_args[@]}" "${resume[@]}" --json
    model="$d/ckpt"
  fi
  echo "epoch $e done in $(( $(date +%s) - start ))s" >&2
done

"$PYTHON" "$HERE/rl_report.py" "$RUN"
