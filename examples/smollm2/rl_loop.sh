#!/usr/bin/env bash
# GRPO on the real model: examples/rl_loop.sh with SmolLM2-135M-Instruct, the real-model
# workload and its math_answer reward, on the prompts the model sometimes solves.
#
#   examples/smollm2/rl_loop.sh [RUN_DIR]            # default RUN_DIR: runs/smollm2
#   EPOCHS=4 LR=2e-5 examples/smollm2/rl_loop.sh runs/x
#
# The model comes from `examples/smollm2/prepare.py models/smollm2` (the README's install does
# it; $MODEL names another directory). rl_prompts.jsonl (14) / rl_eval.jsonl (10) are the
# training and held-back prompts of which a screening rollout at the loop's temperature (K = 4,
# 256 tokens, seed 7) solved at least one sample (workload.py --select): the model solves about
# 3% of the workload's samples at temperature 0.6 and 1.6% at 1, so on most prompts every GRPO
# group has one reward and no signal. Temperature 0.6: at 1 this model's answers are mostly
# noise; `srt train` scores the policy at the temperature the pool records. Training checkpoints
# each decoder layer (--gradient-checkpointing): a step's activations then fit a few GB.
# Rows of 2,048 tokens hold about one prompt's group, so BATCH = 8 makes an optimizer step of
# about each group (11-14 an epoch; rows of 8,192 tokens and 40 sequences made 2, which barely
# moved the policy).
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
export EVAL_K="${EVAL_K:-12}"
export LR="${LR:-5e-5}"
export BATCH="${BATCH:-8}"
export PACK_TOKENS="${PACK_TOKENS:-2048}"
export MAX_NEW="${MAX_NEW:-256}"
export TEMPERATURE="${TEMPERATURE:-0.6}"
export TRAIN_ARGS="${TRAIN_ARGS:---gradient-checkpointing}"
exec "$HERE/../rl_loop.sh" "${1:-runs/smollm2}"
