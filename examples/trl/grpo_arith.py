"""GRPO with TRL's `GRPOTrainer` on srt's tiny agent model and the arith prompts, srt plugged in.

    python examples/trl/grpo_arith.py                      # srt: speculative rollout + packed log-probs
    python examples/trl/grpo_arith.py --rollout trl        # the same run on TRL's defaults
    python examples/trl/grpo_arith.py --model bundled      # the bundled model (<calc> tags; srt runs them)
    python examples/trl/grpo_arith.py --model smollm2 --lr 3e-5 --temperature 0.6 --max-completion-length 256  # the real model

The srt run is three lines on top of a plain TRL script: `srt_rollout_func(cache=..., tools=...)`
as the trainer's `rollout_func` (srt's engine drafting from per-prompt token trees, a tree cache
kept in OUT/cache across steps and runs, srt's tool loop) and `PackedGRPOTrainer` in place of
`GRPOTrainer` (each group's prompt encoded once in the log-prob forwards). Everything else is
TRL's: its config, its reward function interface, its logging. `--rollout trl` is TRL's defaults:
HF `generate`, TRL's own tool loop (`GRPOTrainer(tools=[calculator])`: the agent model calls tools
Hermes-style, which TRL parses with its Qwen3 response template; TRL cannot parse the bundled
model's `<calc>` tags, so that model runs without tools there) and padded forwards.

The model learns to answer with the calculator: the reward is exact match of the last `<answer>`
against the prompt's answer (srt's `exact_match`). `--model smollm2` is the real pretrained model
(SmolLM2-135M-Instruct from `examples/smollm2/prepare.py models/smollm2`, or `$SRT_REAL_MODEL`) on
the RL loop's small problems (`examples/smollm2/rl_prompts.jsonl`), with
no tools and the `math_answer` reward. Each optimizer step prints one JSON line (mean
reward, seconds generating, tokens the log-prob forwards ran, the step's seconds), also appended
to OUT/steps.jsonl; TRL's own log lines follow. bench/trl_bench.py runs both trainers side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_template

from srtcli.models import default_model_dir
from srtcli.rollout.agent.calculator import calculator
from srtcli.trl.rewards import trl_reward
from srtcli.trl.rollout import srt_rollout_func
from srtcli.trl.trainer import PackedGRPOTrainer

HERE = Path(__file__).resolve().parent
AGENT_TOOLS = HERE.parent / "agent" / "tools.py"


def arith_dataset(path: Path, n: int) -> datasets.Dataset:
    """The first `n` prompts of a prompts file as chat conversations (a plain prompt is one user turn)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    chats = [r["prompt"] if isinstance(r["prompt"], list) else [{"role": "user", "content": r["prompt"]}] for r in rows]
    return datasets.Dataset.from_dict({"prompt": chats, "answer": [r["answer"] for r in rows]})


def workload(model_name: str) -> tuple[Path, Path, str]:
    """(model directory, prompts file, reward) of the named model's workload."""
    if model_name == "smollm2":
        model_dir = Path(os.environ.get("SRT_REAL_MODEL", HERE.parents[1] / "models" / "smollm2"))
        return model_dir, HERE.parent / "smollm2" / "rl_prompts.jsonl", "math_answer"
    model_dir = default_model_dir() if model_name == "bundled" else HERE.parent / "agent" / "model"
    return model_dir, HERE.parent / "arith" / "prompts.jsonl", "exact_match"


class StepLog(TrainerCallback):
    """Per optimizer step: mean reward, seconds generating, tokens run by the log-prob forwards
    (packed: the tree's tokens; TRL: its padded batch) and the step's seconds; printed and
    appended to `path` as JSON lines (`rows` keeps them too)."""

    def __init__(self, trainer: GRPOTrainer, path: Path | None = None):
        self.trainer, self.path, self.rows = trainer, path, []
        self.gen_s, self.tokens, self.t0 = 0.0, 0, 0.0
        generate, logprobs = trainer._generate, trainer._get_per_token_logps_and_entropies

        def timed_generate(prompts):
            t = time.perf_counter()
            try:
                return generate(prompts)
            finally:
                self.gen_s += time.perf_counter() - t

        def counted_logprobs(model, input_ids, *args, **kw):
            trainer.srt_stats = {}  # set again by a packed forward, left empty by TRL's own
            out = logprobs(model, input_ids, *args, **kw)
            self.tokens += trainer.srt_stats.get("packed_tokens", input_ids.numel())
            return out

        trainer._generate, trainer._get_per_token_logps_and_entropies = timed_generate, counted_logprobs

    def on_step_begin(self, args, state, control, **kw):
        self.gen_s, self.tokens, self.t0 = 0.0, 0, time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        rewards = self.trainer._metrics["train"].get("reward") or [float("nan")]
        row = {"step": state.global_step, "epoch": math.ceil(state.epoch - 1e-9), "reward": round(rewards[-1], 4),
               "generate_s": round(self.gen_s, 3), "forward_tokens": self.tokens,
               "step_s": round(time.perf_counter() - self.t0, 3)}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")


def build_trainer(rollout: str, model_name: str, out: Path, *, steps: int, prompts: int = 64, per_step: int = 16,
                  k: int = 8, lr: float = 3e-4, max_completion_length: int = 96, tools: bool = True,
                  seed: int = 0, temperature: float = 1.0) -> GRPOTrainer:
    """The trainer this example runs: `rollout` "srt" (srt's rollout_func, PackedGRPOTrainer, a
    tree cache in out/cache) or "trl" (TRL's defaults), on the bundled or the agent model, with the
    calculator between turns where the rollout can run it."""
    torch.manual_seed(seed)
    model_dir, prompts_path, reward = workload(model_name)
    tools = tools and model_name != "smollm2"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).float()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    args = GRPOConfig(output_dir=str(out), report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False,
                      seed=seed, max_steps=steps, learning_rate=lr, num_generations=k, temperature=temperature,
                      per_device_train_batch_size=per_step * k, max_completion_length=max_completion_length,
                      logging_steps=1, save_strategy="no", disable_tqdm=True, log_completions=False)
    ds = arith_dataset(prompts_path, prompts)
    if rollout == "srt":
        spec = None if not tools else ("calculator" if model_name == "bundled" else f"{AGENT_TOOLS}:TOOLS")
        return PackedGRPOTrainer(model, trl_reward(reward), args=args, train_dataset=ds, processing_class=tok,
                                 rollout_func=srt_rollout_func(cache=str(out / "cache"), tools=spec))
    trl_tools = None
    if tools and model_name == "agent":
        trl_tools = [calculator]  # what examples/agent/tools.py:TOOLS holds
        tok.response_template = qwen3_template  # the agent model calls tools as Qwen3 does: TRL parses them
    elif tools:
        print("TRL cannot parse the bundled model's <calc> tags: TRL runs without tools")
    return GRPOTrainer(model, trl_reward(reward), args=args, train_dataset=ds, processing_class=tok, tools=trl_tools)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollout", choices=["srt", "trl"], default="srt",
                    help="srt: srt's rollout_func and PackedGRPOTrainer; trl: TRL's defaults")
    ap.add_argument("--out", default="runs/trl-arith")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=64, help="prompts of the workload's prompts file used")
    ap.add_argument("--per-step", type=int, default=16, help="prompts per optimizer step")
    ap.add_argument("--k", type=int, default=8, help="completions per prompt (num_generations)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-completion-length", type=int, default=96)
    ap.add_argument("--model", choices=["bundled", "agent", "smollm2"], default="agent")
    ap.add_argument("--no-tools", action="store_true", help="no calculator between turns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(a.rollout, a.model, out, steps=a.steps, prompts=a.prompts, per_step=a.per_step, k=a.k,
                            lr=a.lr, max_completion_length=a.max_completion_length, tools=not a.no_tools,
                            seed=a.seed, temperature=a.temperature)
    (out / "steps.jsonl").unlink(missing_ok=True)
    trainer.add_callback(StepLog(trainer, out / "steps.jsonl"))
    trainer.train()


if __name__ == "__main__":
    main()
