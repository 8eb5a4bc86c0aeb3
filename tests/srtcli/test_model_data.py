"""The arith workload behind the bundled model: answers are right, tool results are real
calculator outputs, the committed prompt files are what the seeded generator writes, and
the training script is reproducible."""

import hashlib
import json
import random
import re
import sys
from pathlib import Path

import pytest

from srtcli.models import load_model_and_tokenizer
from srtcli.rollout.rewards import exact_match
from srtcli.rollout.tools import calculator

ARITH = Path(__file__).resolve().parents[2] / "examples" / "arith"
sys.path.insert(0, str(ARITH))
import arith_data  # noqa: E402


def _read(name):
    return [json.loads(line) for line in (ARITH / name).read_text().splitlines() if line.strip()]


def test_every_problem_answer_is_its_expression_value():
    rng = random.Random(7)
    for _ in range(3000):
        p = arith_data.make_problem(rng)
        assert calculator(p.combined) == str(p.answer), p
        assert p.answer >= 0 and all(str(s.left) in p.prompt or isinstance(s.left, str) for s in p.steps)


def test_solutions_use_the_tool_truthfully_and_vary():
    """Every <calc>E</calc><result>V</result> in the training data has V = calculator(E); the
    imperfection is only in mental arithmetic and in copying the final answer."""
    rng = random.Random(3)
    styles, rewards = set(), []
    for _ in range(2000):
        p = arith_data.make_problem(rng)
        text = arith_data.solution_text(p, rng)
        pairs = re.findall(r"<calc>(.*?)</calc><result>(.*?)</result>", text)
        for expr, value in pairs:
            assert calculator(expr) == value, text
        styles.add(min(len(pairs), 2))
        rewards.append(exact_match({"answer": str(p.answer)}, text))
    assert styles == {0, 1, 2}  # mental, one call, step by step
    assert 0.6 < sum(rewards) / len(rewards) < 0.95  # imperfect on purpose, but mostly right


def test_committed_prompt_files_are_the_seeded_generator_output(tmp_path):
    train, held = _read("prompts.jsonl"), _read("eval.jsonl")
    assert len(train) == 128 and len(held) == 64
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    for rec in train + held:
        assert set(rec) == {"id", "prompt", "answer"} and re.fullmatch(r"\d+", rec["answer"])
    again_train = arith_data.prompt_records(128, 1234, "train")
    again_eval = arith_data.prompt_records(64, 1235, "eval", exclude={r["prompt"] for r in again_train})
    assert again_train == train and again_eval == held


@pytest.mark.slow
def test_training_script_is_seeded_and_its_output_loads(tmp_path):
    import train_model

    tiny = ["--steps", "3", "--batch-size", "4", "--hidden", "32", "--layers", "1", "--heads", "2",
            "--vocab-size", "300", "--log-every", "100"]

    def digest(out, seed):
        train_model.main(tiny + ["--out", str(out), "--seed", str(seed)])
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(out.iterdir())}

    a, b, c = digest(tmp_path / "a", 0), digest(tmp_path / "b", 0), digest(tmp_path / "c", 1)
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert set(a) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}
    model, tok = load_model_and_tokenizer(tmp_path / "a")
    assert model.config.hidden_size == 32 and tok.eos_token == "<|im_end|>"
    assert not (tmp_path / "a.tmp").exists()  # built aside and swapped in whole


@pytest.mark.slow
def test_agent_training_script_self_checks_and_its_output_loads(tmp_path, monkeypatch):
    """The agent model's trainer (examples/agent): its data self-check (rollout's tokenization,
    the template's own rendering) passes and a tiny run gives a model srt loads with the tool
    chat template."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples/agent/train_model.py"
    monkeypatch.syspath_prepend(str(path.parent))  # its agent_data, as when run as a script
    spec = importlib.util.spec_from_file_location("agent_train_model", path)
    agent_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_train)
    agent_train.main(["--steps", "2", "--batch-size", "4", "--hidden", "32", "--layers", "1", "--heads", "2",
                      "--vocab-size", "400", "--out", str(tmp_path / "m")])
    model, tok = load_model_and_tokenizer(tmp_path / "m")
    from srtcli.rollout.agent.formats import chat_format_for

    assert chat_format_for(tok) and model.config.max_position_embeddings == 512
