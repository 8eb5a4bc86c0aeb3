#!/usr/bin/env bash
# One prepared GPU run for the rollout engine and the trainer (their CUDA checks and
# measurements), sized for the workplace's lent H200: 15 minutes of device time, at most 10 of
# them per command. `DEV=cpu` rehearses the whole script on the 2-core CPU machine in ~6-8 minutes
# (also with the image's torch 2.11 and transformers 5.17, in a venv of its own: `PY=venv/bin/python`);
# every step has its own timeout, and what the steps wrote to $OUT comes back even if the
# command runs past the device's 10 minutes (the steps are in order of what they are worth).
#
# What it does, in order, writing everything under $OUT (default /tmp/srt-gpu):
#   1. installs the two packages the GPU image lacks (lmdb, zstandard) from carried wheels and
#      builds the token tree's C core in place (the image has torch, transformers, click, rich,
#      pytest, hypothesis);
#   2. runs the engine's exactness tests on CUDA (SRT_TEST_DEVICE=cuda: greedy identity for every
#      drafter, chi-square sampling tests, the cost rule's cuts among them, sampled drafts
#      reporting what they were drawn from) and the CUDA-only FlexAttention test. The real model
#      (SmolLM2-135M, 538 MB prepared, its wheel 93 MB) cannot reach that machine: the device
#      tool carries 64 MiB and the machine reaches no package index, so nothing here runs it;
#   2b. runs the architecture matrix's checks on CUDA (every model family, sliding windows and
#      softcaps, against HF's own generate and forward on the same device; the engine's CUDA
#      KV-memory check runs with them), its packed log-probs with every tree-attention backend
#      and one `srt train` step over shards against the step over the steps pool (FlexAttention
#      with window and softcap score mods, compiled);
#   2c. runs the training exactness tests on CUDA: one optimizer step over packed shards equals
#      the plain per-step reference in loss and gradients (1e-5) for every scenario and loss
#      aggregation, with the tree attention by sdpa, eager and the compiled FlexAttention that
#      `srt train` uses by default with CUDA, the same under bf16 autocast (`--mixed-precision`,
#      on by default with CUDA: packed = plain to bf16's rounding, float32 weights keeping the
#      updates bf16 weights lose), and `srt train` end to end (shards against steps);
#      nothing else in this script trains;
#   3. runs bench/rollout_bench.py with the embedded engine on CUDA (bundled workload, K = 8,
#      T = 1, three epochs) at batch 32 and at batch 8, JSON results beside the logs (`srt` cuts
#      its drafts by the cost rule, from the engine's own CUDA timings: where a forward's cost
#      barely moves with its tokens it should verify the whole budget, as `srt-fixed` does, and
#      never be slower than `none`; `arctic-cost` is arctic's drafts under the same rule; `srt`
#      drafts by p-hat with stops, `srt-counts` by counts: which one the CUDA default should be; `-no-tail`:
#      without the engine's tail trees, which are on by default with CUDA: whether they should be); both runs
#      include the `arctic` config (ArcticInference's SuffixDecoding) where arctic_inference is
#      installed. The GPU image does not have it and the package index has no binary wheel of
#      arctic-inference 0.3 for the image's Python, so there the bench prints one line and
#      skips it, unless a wheel built for that Python (cp312) is put in .whl beside the others;
#      each run ends with the compute-bound ceiling (greedy, plain vs a drafter whose every draft
#      is accepted: the most any drafter can gain on that device with those draft lengths);
#   4. profiles epoch 3 of none and srt (cProfile): on a GPU the 1.2M-parameter model leaves
#      host Python as the likely bottleneck, and this says where it goes;
#   4b. times one optimizer step of `srt train` packed (tree attention: the compiled
#      FlexAttention with CUDA) against padded and one sequence at a time, with peak memory
#      (bench/train_bench.py; with CUDA a 1024-wide, 8-layer Qwen2 with a 32k vocabulary): what
#      prefix-tree packing saves on a GPU, where it has never been timed;
#   5. prints bench/proposer_bench.py (the vLLM proposer's host cost per row per step, 256 rows,
#      1,000- and 8,192-token responses, its tree work on its default 4 threads beside one
#      (`srt-1-thread`) and without the run-wide tree, then verified rows drafting the whole budget with an
#      earlier epoch in the trees, acceptance beside cost, its loads built off the step beside in
#      it (`srt-in-step`); CPU work, ~2.5 minutes) on that machine's CPU (16 cores: the builds'
#      threads get cores of their own there);
#   6. where the image has vLLM (too large to carry: without it this prints one line and skips):
#      the SRT speculator against `none` and vLLM's own `suffix` on CUDA, one engine each side by
#      side (bench/rollout_bench.py --engine vllm: K = 8, T = 0, three epochs on one cache, the
#      small head-32 Llama; `suffix` only where arctic_inference is importable, e.g. from a cp312
#      wheel in .whl), printed, no file; agent rollouts on vLLM (`--agent`: the agent model and its
#      calculator, each turn a request drafting from its prompt's tree, none against srt); a tool
#      sleeping 200 ms per call on vLLM (bench/tool_latency_bench.py --engine vllm); then
#      tests/srtcli/rollout/vllm/test_vllm_serve.py and test_vllm_agent.py on CUDA (`vllm serve`
#      with only the speculative config and SRT_CACHE, greedy outputs equal to a server without
#      speculation, a restarted server drafting from the cache; agent pools equal to the embedded
#      engine's) (~5 minutes).
#
# Prepare here (the GPU machine reaches no package index), once per checkout:
#     echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl lmdb zstandard
# then call the device tool's `run` with carry [".whl"], timeout_s 600 and the command
#     bash bench/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/srt-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEV=${DEV:-cuda}  # DEV=cpu rehearses the whole script on a CPU machine

step() { echo "== $* ($(date +%T))"; }

step setup
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
$PY setup.py -q build_ext --inplace >/tmp/srt-build.log 2>&1 || { cat /tmp/srt-build.log; exit 1; }
{ nvidia-smi; $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__)"; } \
    2>&1 | tee "$OUT/tests_$DEV.log"

step "exactness tests on $DEV"
# no -q here: pyproject's addopts give one, and a second hides the pass/skip counts; -rs says why
# a test skipped (on the GPU a skip is a finding)
SRT_TEST_DEVICE=$DEV timeout 240 $PY -m pytest -rs -p no:cacheprovider \
    tests/srtcli/rollout/engine/test_engine.py tests/srtcli/rollout/engine/test_engine_sampling.py tests/srtcli/rollout/engine/test_tree_verify.py \
    tests/srtcli/rollout/engine/test_tail_trees.py tests/srtcli/rollout/engine/test_tail_drafts.py \
    tests/srtcli/rollout/test_draft_honesty.py \
    tests/attention/test_masks.py 2>&1 \
    | tee -a "$OUT/tests_$DEV.log" | tail -15

step "architecture matrix on $DEV: greedy = HF generate, old log-probs and packed log-probs = HF forward, a train step over shards = over steps (sliding windows, softcaps)"
SRT_TEST_DEVICE=$DEV timeout 240 $PY -m pytest -rs -p no:cacheprovider tests/srtcli/test_arch_matrix.py \
    -k "greedy_rollout or old_logprobs or packed_logprobs or train_step_over_shards" 2>&1 \
    | tee "$OUT/arch_matrix_$DEV.log" | tail -15

step "training exactness on $DEV: a step over packed shards = the plain step (sdpa, eager, flex; layers checkpointed too; bf16 autocast), srt train end to end"
SRT_TEST_DEVICE=$DEV timeout 240 $PY -m pytest -rs -p no:cacheprovider tests/srtcli/train/test_exact.py \
    tests/attention/test_checkpointing.py tests/srtcli/train/test_precision.py \
    "tests/srtcli/cli/test_train.py::test_shards_and_steps_agree_and_the_output_is_a_model" \
    "tests/srtcli/cli/test_train.py::test_mixed_precision_keeps_the_small_updates_that_bf16_weights_round_away" 2>&1 \
    | tee -a "$OUT/tests_$DEV.log" | tail -15

step "rollout bench, $DEV, batch 32"
timeout 200 $PY bench/rollout_bench.py --device $DEV --limit 32 --epochs 3 --tools -n 8 --max-new-tokens 96 \
    --batch-size 32 --rollout-batch 8 --json-out "$OUT/rollout_${DEV}_b32.json" \
    --configs none,ngram,suffix,srt,srt-fixed,srt-no-tail,srt+run-ahead,srt+run-ahead-no-tail,srt-counts,srt-tree-wide,srt-adaptive,arctic,arctic-cost,arctic-no-tail 2>&1 | tee "$OUT/rollout_${DEV}_b32.log" | tail -30

step "rollout bench, $DEV, batch 8"
timeout 120 $PY bench/rollout_bench.py --device $DEV --limit 16 --epochs 3 --tools -n 8 --max-new-tokens 96 \
    --batch-size 8 --rollout-batch 4 --configs none,suffix,srt,srt-fixed,srt-no-tail,srt-counts,srt-adaptive,srt-tree-wide,srt-tree-48,arctic \
    --json-out "$OUT/rollout_${DEV}_b8.json" 2>&1 | tee "$OUT/rollout_${DEV}_b8.log" | tail -20
step "profile: where a step's time goes (host Python vs the model), none and srt, batch 32"
timeout 120 $PY bench/rollout_bench.py --device $DEV --limit 32 --epochs 3 --tools -n 8 --max-new-tokens 96 \
    --batch-size 32 --rollout-batch 8 --configs none,srt --profile "$OUT/profile_${DEV}_b32" 2>&1 | grep "^epoch 3"
cat "$OUT/profile_${DEV}_b32"-*.txt > "$OUT/profile_${DEV}_b32.txt" 2>/dev/null && rm -f "$OUT/profile_${DEV}_b32"-*.txt "$OUT/profile_${DEV}_b32"-*.prof
step "training bench on $DEV: one optimizer step, packed (tree attention) vs padded vs one sequence at a time"
if [[ $DEV == cuda ]]; then TB=(--hidden 1024 --layers 8 --vocab 32000 --repeats 3); else TB=(--hidden 128 --layers 2 --repeats 1); fi
timeout 240 $PY bench/train_bench.py "${TB[@]}" 2>&1 | tee "$OUT/train_bench_$DEV.log" | tail -8
timeout 120 $PY bench/train_bench.py "${TB[@]}" --scenarios 8/1024/256 --gradient-checkpointing 2>&1 \
    | tee -a "$OUT/train_bench_$DEV.log" | tail -5
step "SRT proposer host cost per vLLM step (CPU only; printed beside the CUDA figures, no file)"
for t in 1000 8192; do
    timeout 150 $PY bench/proposer_bench.py --rows 256 --tokens $t --steps 600 --own-tree --one-thread 2>&1 | tail -7
done
# drafting beside cost as vLLM on CUDA runs it: verified rows, the whole budget, an earlier epoch
# (16 x 8,192 stored tokens a prompt), 20 ms forwards; loads off the step against in the step
timeout 150 $PY bench/proposer_bench.py --rows 256 --tokens 8192 --steps 300 --verify --fixed-budget --history 16 \
    --forward-ms 20 --in-step 2>&1 | tail -6
step "vLLM on $DEV: the SRT speculator against none and vLLM's suffix, agent rollouts, then vllm serve with it"
if $PY -c "import vllm" >/dev/null 2>&1; then
    VCONF=none,srt
    if $PY -c "import arctic_inference" >/dev/null 2>&1; then
        VCONF=none,srt,suffix
    else
        echo "arctic_inference is not importable: vLLM's suffix is not measured"
    fi
    timeout 240 $PY bench/rollout_bench.py --engine vllm --limit 32 --epochs 3 -n 8 --max-new-tokens 96 \
        --batch-size 64 --configs $VCONF 2>&1 | grep -E "^(epoch |\||[a-z]+: vLLM engine)" | tail -30
    timeout 200 $PY bench/rollout_bench.py --engine vllm --agent --limit 32 --epochs 3 -n 8 --max-new-tokens 96 \
        --batch-size 64 --configs none,srt 2>&1 | grep -E "^(epoch |\||[a-z]+: vLLM engine)" | tail -12
    timeout 100 $PY bench/tool_latency_bench.py --engine vllm --limit 16 -n 4 2>&1 | tail -5
    timeout 300 $PY -m pytest -rs -p no:cacheprovider tests/srtcli/rollout/vllm/test_vllm_serve.py \
        tests/srtcli/rollout/vllm/test_vllm_agent.py 2>&1 | tail -5
else
    echo "vllm is not installed in this image: the vLLM measurements are skipped"
fi
step done  # 8 files in $OUT (the environment in the tests' log, the two profiles in one): the device tool brings back at most 8
