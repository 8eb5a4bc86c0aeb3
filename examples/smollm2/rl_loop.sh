#!/usr/bin/env bash
# GRPO on the real model: examples/rl_loop.sh with SmolLM2-135M-Instruct, the real-model
# workload's reward (math_answer), on small problems the model solves a fair part of the time.
#
#   examples/smollm2/rl_loop.sh [RUN_DIR]            # default RUN_DIR: runs/smollm2
#   EPOCHS=4 LR=2e-5 examples/smollm2/rl_loop.sh runs/x
#
# The model comes from `examples/smollm2/prepare.py models/smollm2` (the README's install does
# it; $MODEL names another directory). rl_prompts.jsonl (48) / rl_eval.jsonl (32, none of the
# training problems) are one-step problems with small numbers asking for the number only
# (workload.py --rl): the model answers them right about a fifth of the time at temperature
# 0.6, so about half the GRPO groups hold rewards of 0 and 1. On the arith problems it solves
# about 3% of its samples, most groups have one reward, and a run does not move the held-back
# reward (measured: docs/benchmarks.md). Temperature 0.6: at 1 this model's answers are mostly
# noise; `srt train` scores the policy at the temperature the pool records. Its answers are a
# sentence or two (~30 tokens), so 64 new tokens. Training checkpoints each decoder layer
# (--gradient-checkpointing). Rows of 2,048 tokens, 32 sequences per optimizer step: 5-7
# optimizer steps an epoch.
# Everything else (resuming, the report) is examples/rl_loop.sh's.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$(dirname "$HERE")")"
export MODEL="${MODEL:-$ROOT/models/smollm2}"
export PROMPTS="${PROMPTS:-$HERE/rl_prompts.jsonl}"
export EVAL="${EVAL:-$HERE/rl_eval.jsonl}"
export REWARD="${REWARD:-math_answer}"
export TOOLS="${TOOLS-}"
export EPOCHS="${EPOCHS:-4}"
export K="${K:-8}"
export EVAL_K="${EVAL_K:-8}"
export LR="${LR:-3e-5}"
export BATCH="${BATCH:-32}"
export PACK_TOKENS="${PACK_TOKENS:-2048}"
export MAX_NEW="${MAX_NEW:-64}"
export TEMPERATURE="${TEMPERATURE:-0.6}"
export TRAIN_ARGS="${TRAIN_ARGS:---gradient-checkpointing}"
exec "$HERE/../rl_loop.sh" "${1:-runs/smollm2}"
