"""The rollout's typed options: the command's defaults are the config's, and the rules derived
from more than one option (or from the device) are the documented ones."""

from __future__ import annotations

from pathlib import Path

from srtcli.cli.rollout import rollout
from srtcli.rollout.config import TAIL_NODES, RolloutConfig


def test_every_option_of_the_command_is_a_field_with_the_commands_default():
    parsed = rollout.make_context("rollout", ["--prompts", "p.jsonl"]).params
    parsed.pop("as_json")
    assert RolloutConfig(**parsed) == RolloutConfig(prompts_path="p.jsonl")


def test_the_bundled_model_calls_the_calculator_and_other_models_no_tool():
    assert RolloutConfig("p.jsonl").tool == "calculator"
    assert RolloutConfig("p.jsonl", model="m").tool == "none"
    assert RolloutConfig("p.jsonl", model="m", tools="calculator").tool == "calculator"
    assert RolloutConfig("p.jsonl", tools="none").tool == "none"


def test_the_pool_file_is_out_itself_or_rollout_jsonl_inside_it():
    assert RolloutConfig("p.jsonl", out="runs/a.jsonl").pool_file == Path("runs/a.jsonl")
    assert RolloutConfig("p.jsonl", out="runs/a").pool_file == Path("runs/a/rollout.jsonl")


def test_device_defaults_run_ahead_with_cuda_and_flags_win():
    c = RolloutConfig("p.jsonl")
    assert c.draft_length == "cost"  # the embedded engine's, on every device
    assert not c.run_ahead_on("cpu") and c.run_ahead_on("cuda")
    set_ = RolloutConfig("p.jsonl", draft_length="fixed", run_ahead=True)
    assert set_.run_ahead_on("cpu")


def test_the_vllm_proposer_leaves_the_cost_rule_to_the_device_default():
    # srt does not time vLLM's forwards: `cost` there is the adaptive length off CUDA
    assert RolloutConfig("p.jsonl").proposer_adaptive("cpu")
    assert not RolloutConfig("p.jsonl").proposer_adaptive("cuda")
    assert RolloutConfig("p.jsonl", draft_length="adaptive").proposer_adaptive("cuda")
    assert not RolloutConfig("p.jsonl", draft_length="fixed").proposer_adaptive("cpu")


def test_tail_trees_default_on_with_cuda_where_the_attention_verifies_trees_and_the_flag_wins():
    c = RolloutConfig("p.jsonl")
    assert c.tail_trees("cuda", "sdpa") == c.tail_trees("cuda", "eager") == TAIL_NODES
    assert c.tail_trees("cpu", "sdpa") == c.tail_trees("cuda", "flash_attention_2") == 0
    assert RolloutConfig("p.jsonl", tail_nodes=16).tail_trees("cpu", "sdpa") == 16
    assert RolloutConfig("p.jsonl", tail_nodes=0).tail_trees("cuda", "sdpa") == 0


def test_a_rollout_batch_of_0_is_every_prompt_left():
    assert RolloutConfig("p.jsonl").batch_prompts(7) == 7
    assert RolloutConfig("p.jsonl").batch_prompts(0) == 1  # a resumed pool with nothing left
    assert RolloutConfig("p.jsonl", rollout_batch=3).batch_prompts(7) == 3
