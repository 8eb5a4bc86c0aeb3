"""The bundled model: standard HF files that load offline, a sensible tokenizer, and a policy
that is good but imperfect (rewards differ inside a group at temperature 1)."""

import json
import random
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from srtcli.models import default_model_dir, load_model_and_tokenizer
from srtcli.rollout.tools import CALC_CLOSE

ROOT = Path(__file__).resolve().parents[2]
ARITH = ROOT / "examples" / "arith"
sys.path.insert(0, str(ARITH))
import arith_data  # noqa: E402
import arith_eval  # noqa: E402

TAGS = ["<calc>", "</calc>", "<result>", "</result>", "<answer>", "</answer>"]


@pytest.fixture(scope="module")
def bundled():
    torch.set_num_threads(1)
    return load_model_and_tokenizer(default_model_dir())


def test_files_size_and_architecture():
    d = default_model_dir()
    assert d == ROOT / "srtcli" / "bundled_model"
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        assert (d / f).is_file(), f
    assert sum(f.stat().st_size for f in d.iterdir()) <= 10 * 1024 * 1024
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] < 1000


def test_loads_offline_with_auto_classes(monkeypatch, bundled):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir()))
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    gen = json.loads((default_model_dir() / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id == model.config.eos_token_id


def test_chat_template(bundled):
    _, tok = bundled
    msgs = [{"role": "user", "content": "Ann has 3 pens."}]
    with_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    without = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert with_gen == "<|im_start|>user\nAnn has 3 pens.<|im_end|>\n<|im_start|>assistant\n"
    assert without == "<|im_start|>user\nAnn has 3 pens.<|im_end|>\n"
    two = msgs + [{"role": "assistant", "content": "<answer>3</answer>"}]
    assert tok.apply_chat_template(two, tokenize=False).endswith("<|im_start|>assistant\n<answer>3</answer><|im_end|>\n")


def test_tags_and_digits_are_single_tokens_and_text_round_trips(bundled):
    _, tok = bundled
    for tag in TAGS + ["<|im_end|>", "<|im_start|>"]:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    ids = tok.encode("x 90417 y", add_special_tokens=False)
    assert [t for t in tok.convert_ids_to_tokens(ids) if t.isdigit()] == list("90417")
    rng = random.Random(0)
    for _ in range(50):
        p = arith_data.make_problem(rng)
        text = p.prompt + " " + arith_data.solution_text(p, rng)
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    odd = "naïve 東京 🙂 <calc> ab</calc>"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd  # byte-level: no unknown token
    # tags survive skip_special_tokens (rewards and tools read them from decoded text); eos does not
    ids = tok.encode("<answer>7</answer><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<answer>7</answer>"


def test_tool_results_tokenize_the_same_appended_or_inline(bundled):
    """Rollout appends `<result>V</result>` tokens after `</calc>`; training saw them inline."""
    _, tok = bundled
    rng = random.Random(1)
    for _ in range(100):
        p = arith_data.make_problem(rng)
        text = arith_data.solution_text(p, rng)
        if CALC_CLOSE not in text:
            continue
        cut = text.index(CALC_CLOSE) + len(CALC_CLOSE)
        end = text.index("</result>") + len("</result>")
        pieces = [text[:cut], text[cut:end], text[end:]]
        glued = sum((tok.encode(x, add_special_tokens=False) for x in pieces), [])
        assert glued == tok.encode(text, add_special_tokens=False), text


def test_a_tokenizer_without_tag_tokens_would_fail():
    """Without the added tag tokens `</calc>` is several tokens: the engine could not stop on it."""
    import train_model
    from tokenizers import Tokenizer

    rng = random.Random(0)
    corpus = []
    for _ in range(300):
        p = arith_data.make_problem(rng)
        corpus += [p.prompt, arith_data.solution_text(p, rng)]
    good = train_model.build_tokenizer(corpus, 400)
    assert len(good.encode(CALC_CLOSE).ids) == 1
    bad = Tokenizer.from_str(good.to_str())
    bad_json = json.loads(bad.to_str())
    bad_json["added_tokens"] = [t for t in bad_json["added_tokens"] if t["content"] not in TAGS]
    bad = Tokenizer.from_str(json.dumps(bad_json))
    assert len(bad.encode(CALC_CLOSE).ids) > 1


def _records(n):
    return [json.loads(line) for line in (ARITH / "eval.jsonl").read_text().splitlines()[:n]]


def test_greedy_policy_solves_most_problems(bundled):
    model, tok = bundled
    res = arith_eval.evaluate(model, tok, _records(16), k=1, temperature=0.0)
    assert res.mean_reward >= 0.5, res.mean_reward
    assert all(s.text.count("<answer>") >= 1 for s in res.samples)


@pytest.mark.slow
def test_sampling_at_t1_gives_mixed_rewards_and_multi_turn_tool_use(bundled):
    model, tok = bundled
    res = arith_eval.evaluate(model, tok, _records(12), k=8, temperature=1.0, seed=0)
    assert 0.2 < res.mean_reward < 0.95, res.mean_reward  # good, not perfect: GRPO has a signal
    assert res.groups_with_variance >= 0.25, res.groups_with_variance
    assert res.tool_use > 0.3 and res.mean_turns > 1.5
    assert any(s.turns >= 3 for s in res.samples)  # two tool calls: three turns
    lengths = [len(tok.encode(s.text, add_special_tokens=False)) for s in res.samples]
    assert 15 <= sum(lengths) / len(lengths) <= 80


@pytest.mark.slow
def test_srt_rollout_runs_on_the_bundled_model_with_no_model_flag(tmp_path):
    """Right after install, `srt rollout --prompts <workload>` needs nothing else."""
    import subprocess

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join((ARITH / "prompts.jsonl").read_text().splitlines(keepends=True)[:2]))
    srt = Path(sys.executable).parent / "srt"
    out = subprocess.run([str(srt), "rollout", "--prompts", str(prompts), "-n", "2", "--tools", "calculator",
                          "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "pool"), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["prompts"] == 2 and summary["generated_tokens"] > 0
    steps = [json.loads(line) for line in (tmp_path / "pool" / "rollout.jsonl").read_text().splitlines()]
    assert {s["meta"]["prompt_id"] for s in steps} == {"train-0000", "train-0001"}
