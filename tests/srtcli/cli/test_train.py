"""`srt train` end to end: both data paths, checkpoints, metrics, --config, --resume (also
after a real SIGKILL), and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from srtcli.cli import cli
from tests.srtcli.train.fixtures import model_dir, pack_pool, scenario, write_pool

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    model = model_dir(root / "model", tokenizer=True)
    steps = scenario("k_samples", model) + scenario("multi_turn", model, seed=1)
    pool = write_pool(steps, root / "pool")
    shards = pack_pool(pool, root / "shards", 4096)
    return {"model": model, "pool": pool, "shards": shards, "ref": model_dir(root / "ref", seed=5)}


def srt(*args):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    return r


def run_json(*args):
    r = srt(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_shards_and_steps_agree_and_the_output_is_a_model(setup, tmp_path):
    common = ["--model", setup["model"], "--lr", "1e-3", "--kl-coef", "0.05", "--ref-model", setup["ref"],
              "--loss-agg", "seq-mean-token-sum"]
    a = run_json("train", "--shards", setup["shards"], "--out", tmp_path / "a", *common)
    b = run_json("train", "--steps", setup["pool"], "--out", tmp_path / "b", *common)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert a["steps"] == 1 and a["wall_s"] > 0 and a["token_ratio"] < 0.75 and b["token_ratio"] == 1.0
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6
    assert any(not torch.equal(wa[k], weights(setup["model"])[k]) for k in wa)  # it did train
    rec = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("loss", "clip_frac", "kl", "grad_norm", "tokens", "packed_tokens", "token_ratio", "tokens_per_s", "lr"):
        assert key in rec
    assert rec["kl"] > 0 and 0 < rec["clip_frac"] < 1 and rec["packed_tokens"] < rec["tokens"]
    from srtcli.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tmp_path / "a")  # what `srt rollout --model` does
    assert tok.eos_token == "</s>" and model.config.vocab_size == 61


def test_gradient_checkpointing_trains_the_same_weights(setup, tmp_path):
    common = ["--shards", setup["shards"], "--model", setup["model"], "--lr", "1e-3", "--kl-coef", "0.05"]
    a = run_json("train", *common, "--out", tmp_path / "a")
    b = run_json("train", *common, "--out", tmp_path / "b", "--gradient-checkpointing")
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6


def test_mixed_precision_keeps_the_small_updates_that_bf16_weights_round_away(setup, tmp_path):
    """At lr 1e-6 Adam moves each weight by ~1e-6, far below bf16's resolution for weights of
    ~0.02: bf16 weights (`--dtype bfloat16`, the wrong variant) come out unchanged, float32
    weights under bf16 autocast (`--mixed-precision bf16`) are updated."""
    common = ["--shards", setup["shards"], "--model", setup["model"], "--lr", "1e-6"]
    start = weights(setup["model"])
    amp = run_json("train", *common, "--out", tmp_path / "amp", "--mixed-precision", "bf16")
    low = run_json("train", *common, "--out", tmp_path / "low", "--dtype", "bfloat16", "--mixed-precision", "no")
    assert amp["mixed_precision"] == "bf16" and low["mixed_precision"] == "no"
    w_amp, w_low = weights(tmp_path / "amp"), weights(tmp_path / "low")
    assert all(w.dtype == torch.float32 for w in w_amp.values())

    def moved(w: dict, before: dict) -> float:  # the fraction of the weights the step changed
        return sum(int((w[k] != before[k]).sum()) for k in w) / sum(v.numel() for v in w.values())

    assert moved(w_amp, start) > 0.5
    assert moved(w_low, {k: v.bfloat16() for k, v in start.items()}) < 0.05  # only weights near 0
    auto = run_json("train", *common, "--out", tmp_path / "auto")  # on a CPU: no autocast
    assert auto["mixed_precision"] == ("bf16" if torch.cuda.is_available() else "no")


def test_config_file_and_flags(setup, tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"steps: {setup['pool']}\nmodel: {setup['model']}\nlr: 0.01\nepochs: 2\nbatch-size: 4\n")
    s = run_json("train", "--config", cfg, "--out", tmp_path / "o", "--epochs", "1")
    lines = (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()
    n_steps = len(lines)
    assert s["steps"] == n_steps == 4  # 15 steps in batches of >= 4 sequences, one epoch (the flag won)
    assert json.loads(lines[0])["lr"] == 0.01 and json.loads(lines[0])["seqs"] == 4


def test_resume_continues_exactly(setup, tmp_path):
    args = ["train", "--steps", setup["pool"], "--model", setup["model"], "--lr", "1e-2", "--epochs", "3",
            "--warmup-steps", "2", "--grad-clip", "0.5"]
    full = run_json(*args, "--out", tmp_path / "full")
    part = run_json(*args, "--out", tmp_path / "part", "--max-steps", "1")
    assert part["steps"] == 1
    r = srt(*args, "--out", tmp_path / "part")
    assert r.exit_code == 1 and "--resume" in r.output  # never clobbers a run
    rest = run_json(*args, "--out", tmp_path / "part", "--resume")
    assert rest["steps"] == 3 and rest["steps_run"] == 2
    wf, wp = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert all(torch.equal(wf[k], wp[k]) for k in wf)
    steps = [json.loads(x)["step"] for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_resume_after_sigkill_equals_an_uninterrupted_run(setup, tmp_path):
    args = [sys.executable, "-m", "srtcli", "train", "--steps", str(setup["pool"]), "--model", str(setup["model"]),
            "--lr", "1e-2", "--epochs", "10", "--batch-size", "4", "--save-every", "1", "--lr-schedule", "cosine"]
    out = tmp_path / "killed"
    proc = subprocess.Popen(args + ["--out", str(out)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "checkpoints" / "step-00000005").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted((out / "checkpoints").glob("step-*"))
    assert done and len(done) < 40, "the run must be killed mid-way"
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "lo')  # as if killed mid-line
    (out / "checkpoints" / ".step-00000099.tmp-1").mkdir()  # as if killed mid-save
    r = subprocess.run(args + ["--out", str(out), "--resume", "--json"], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ref = subprocess.run(args + ["--out", str(tmp_path / "ref"), "--json"], env=ENV, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    wk, wr = weights(out), weights(tmp_path / "ref")
    assert max(float((wk[k] - wr[k]).abs().max()) for k in wk) <= 1e-6
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 41))
    assert not list((out / "checkpoints").glob(".step-*"))


def _one_line_error(r, *needles):
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and r.output.startswith("Error: ")
    assert len(r.output.strip().splitlines()) == 1, r.output
    for n in needles:
        assert str(n) in r.output


def test_bad_input_is_one_line(setup, tmp_path):
    m = ["--model", setup["model"], "--out", tmp_path / "o"]
    _one_line_error(srt("train", "--steps", tmp_path / "nope", *m), tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    _one_line_error(srt("train", "--steps", tmp_path / "empty", *m), "empty steps pool")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jsonl").write_text("{oops\n")
    _one_line_error(srt("train", "--steps", tmp_path / "bad", *m), "a.jsonl:1:")
    _one_line_error(srt("train", "--shards", tmp_path / "nope", *m), "nope")
    _one_line_error(srt("train", "--shards", tmp_path / "empty", *m), "manifest.json")
    _one_line_error(srt("train", "--steps", setup["pool"], "--shards", setup["shards"], *m), "exactly one")
    _one_line_error(srt("train", "--steps", setup["pool"], "--model", tmp_path / "empty", "--out", tmp_path / "o"),
                    "not a model directory")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text("{not json")
    _one_line_error(srt("train", "--steps", setup["pool"], "--model", tmp_path / "cfg", "--out", tmp_path / "o"),
                    "config.json")
    _one_line_error(srt("train", "--steps", setup["pool"], "--model", tmp_path / "nomodel", "--out", tmp_path / "o"),
                    "model directory not found")
    adapter = tmp_path / "adapter"  # weights under a name transformers does not load: the rule rollout uses
    adapter.mkdir()
    (adapter / "config.json").write_text((setup["model"] / "config.json").read_text())
    (adapter / "adapter_model.safetensors").write_bytes((setup["model"] / "model.safetensors").read_bytes())
    _one_line_error(srt("train", "--steps", setup["pool"], "--model", adapter, "--out", tmp_path / "o"),
                    f"{adapter}: not a model directory (no weights: expected model.safetensors)")
    if not torch.cuda.is_available():
        _one_line_error(srt("train", "--steps", setup["pool"], *m, "--attn", "flex"), "CUDA")
    assert not (tmp_path / "o").exists()  # nothing written on a failed start


def test_nproc_checks_the_inputs_once_before_launching(setup, tmp_path):
    """With --nproc the checks of a one-process run come first, in this process: one line, no
    torchrun (whose ranks would each report it, with its failure report)."""
    m = ["--steps", setup["pool"], "--model", setup["model"], "--nproc", "2"]
    _one_line_error(srt("train", *m, "--out", tmp_path / "o", "--lr", "nan"), "--lr", "finite")
    (tmp_path / "file").write_text("x")
    _one_line_error(srt("train", *m, "--out", tmp_path / "file"), "--out must be a directory")
    if not torch.cuda.is_available():
        _one_line_error(srt("train", *m, "--out", tmp_path / "o", "--attn", "flex"), "CUDA")
    assert not (tmp_path / "o").exists()


def _small_model(path: Path, kind: str) -> Path:
    """A model that does not fit the data: a 32-id vocabulary, or GPT-2 with 16 positions."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if kind == "vocab":
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("data", ["steps", "shards"])
def test_inputs_that_would_fail_mid_run_are_one_line_and_write_nothing(setup, tmp_path, data):
    d = ["--" + data, setup["pool"] if data == "steps" else setup["shards"]]
    out = tmp_path / "o"
    _one_line_error(srt("train", *d, "--model", _small_model(tmp_path / "v", "vocab"), "--out", out),
                    "is outside the vocabulary", "(32 ids)")
    _one_line_error(srt("train", *d, "--model", _small_model(tmp_path / "g", "positions"), "--out", out),
                    "longer than", "positions for (16")
    for flag, value in (("--lr", "-1"), ("--lr", "nan"), ("--weight-decay", "inf"), ("--clip", "nan")):
        _one_line_error(srt("train", *d, "--model", setup["model"], "--out", out, flag, value), flag, "finite")
    _one_line_error(srt("train", *d, "--model", setup["model"], "--out", out, "--kl-coef", "0.1",
                        "--ref-model", tmp_path / "v"), "is outside the vocabulary", str(tmp_path / "v"))
    assert not out.exists()  # so a corrected rerun is a fresh run, not "already holds a training run"
    assert run_json("train", *d, "--model", setup["model"], "--out", out)["steps_run"] == 1


def test_resume_refuses_a_changed_run(setup, tmp_path):
    base = ["train", "--steps", setup["pool"], "--model", setup["model"], "--out", tmp_path / "o", "--lr", "1e-2",
            "--epochs", "3"]
    run_json(*base, "--max-steps", "1")
    before = {p: p.read_bytes() for p in (tmp_path / "o").rglob("*") if p.is_file()}
    other_pool = write_pool(scenario("k_samples", setup["model"], seed=7), tmp_path / "other-pool")
    for flags, says in {
        ("--lr", "5e-3"): "--lr: recorded 0.01, now 0.005",
        ("--model", setup["ref"]): f"--model: recorded {setup['model']}",
        ("--steps", other_pool): f"--steps: recorded {setup['pool']}",
        ("--shards", setup["shards"]): "--shards: recorded not set",
        ("--clip", "0.3"): "--clip: recorded 0.2, now 0.3",
        ("--batch-size", "4"): "--batch-size: recorded 0, now 4",
        ("--kl-coef", "0.1"): "--kl-coef: recorded 0.0, now 0.1",
        ("--lr-schedule", "cosine"): "--lr-schedule: recorded constant, now cosine",
    }.items():
        argv = [*base, "--max-steps", "1", "--resume", *flags]
        if flags[0] == "--shards":
            argv = [a for a in argv if a not in ("--steps", setup["pool"])]
        _one_line_error(srt(*argv), "cannot resume a changed run", says)
    assert {p: p.read_bytes() for p in (tmp_path / "o").rglob("*") if p.is_file()} == before
    # speed and memory options may change, and so may the plan's length (--max-steps 0: all 3 steps)
    r = srt(*base, "--resume", "--micro-batch-tokens", "64", "--attn", "eager", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps_run"] == 2
    assert "note: resuming with --max-steps: recorded 1, now 0: the run now ends at step 3" in r.output


def test_resume_with_a_cosine_schedule_keeps_its_length(setup, tmp_path):
    base = ["train", "--steps", setup["pool"], "--model", setup["model"], "--out", tmp_path / "o", "--lr", "1e-2",
            "--epochs", "3", "--lr-schedule", "cosine", "--max-steps", "1"]
    run_json(*base)
    _one_line_error(srt(*base, "--resume", "--max-steps", "2"), "recorded a cosine schedule of 1 steps, now 2")
    assert run_json(*base, "--resume", "--epochs", "5")["steps_run"] == 0  # still 1 step: the same schedule


def test_resume_past_the_end_of_the_plan_does_nothing(setup, tmp_path):
    base = ["train", "--steps", setup["pool"], "--model", setup["model"], "--out", tmp_path / "o", "--lr", "1e-2"]
    assert run_json(*base, "--epochs", "3")["steps"] == 3  # one optimizer step per epoch
    w = weights(tmp_path / "o")
    r = srt(*base, "--resume", "--max-steps", "9", "--json")  # --epochs 1 now: a 1-step plan
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["steps_run"] == 0 and s["steps"] == 3
    said = [line for line in r.output.splitlines() if "nothing to do" in line]
    assert len(said) == 1 and "already holds step 3" in said[0]
    assert "the run now ends at step 1" in r.output  # the changed plan length is said, not hidden
    assert sorted(p.name for p in (tmp_path / "o" / "checkpoints").iterdir()) == ["step-00000003"]
    wa = weights(tmp_path / "o")
    assert all(torch.equal(w[k], wa[k]) for k in w)
    again = run_json(*base, "--epochs", "3", "--resume")  # resuming a finished run: nothing to do either
    assert again["steps_run"] == 0 and again["steps"] == 3


def test_a_checkpoint_without_a_run_record_resumes_with_a_note(setup, tmp_path):
    base = ["train", "--steps", setup["pool"], "--model", setup["model"], "--out", tmp_path / "o", "--lr", "1e-2",
            "--epochs", "2"]
    run_json(*base, "--max-steps", "1")
    state_file = tmp_path / "o" / "checkpoints" / "step-00000001" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=False)
    del state["extra"]["run"]  # as an older srt wrote it: the options only
    torch.save(state, state_file)
    _one_line_error(srt(*base, "--resume", "--lr", "1e-3"), "--lr: recorded 0.01, now 0.001")
    r = srt(*base, "--resume", "--json")
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if "no run record" in line]
    assert len(notes) == 1 and "model and data could not be checked" in notes[0]
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps_run"] == 1


def test_training_scores_the_policy_at_the_rollouts_temperature(tmp_path):
    """A pool sampled at T = 0.6 holds log-probs of softmax(logits / 0.6); training from the
    rollout's own policy must then see every ratio at 1 on both data paths. Scoring at T = 1
    instead (`--temperature 1`, what ignoring the pool's temperature would do) is caught."""
    lines = Path("examples/arith/prompts.jsonl").read_text().splitlines(True)
    pools = {}
    for i, t in enumerate(("0.6", "1.0")):  # other prompts each, so that the pools can be mixed
        prompts, pools[t] = tmp_path / f"prompts-{t}.jsonl", tmp_path / f"pool-{t}"
        prompts.write_text("".join(lines[4 * i : 4 * i + 4]))
        run_json("rollout", "--prompts", prompts, "-n", "4", "--max-new-tokens", "24", "--temperature", t,
                 "--cache", tmp_path / f"cache-{t}", "--out", pools[t])
    shards = tmp_path / "shards"
    run_json("pack", "--steps", pools["0.6"], "--out", shards)

    def ratio(*data, extra=()):
        out = tmp_path / f"train-{len(list(tmp_path.iterdir()))}"
        run_json("train", *data, "--out", out, "--lr", "1e-3", *extra)
        return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])

    for data in (("--shards", shards), ("--steps", pools["0.6"])):
        rec = ratio(*data)
        assert rec["clip_frac"] == 0 and rec["ratio_mean"] == pytest.approx(1.0, abs=1e-4), data
    wrong = ratio("--steps", pools["0.6"], extra=("--temperature", "1"))
    assert wrong["clip_frac"] > 0 and abs(wrong["ratio_mean"] - 1.0) > 1e-3, wrong

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "rollout.jsonl").write_text("".join((p / "rollout.jsonl").read_text() for p in pools.values()))
    r = srt("train", "--steps", mixed, "--out", tmp_path / "x")
    assert r.exit_code == 1 and "steps sampled at different temperatures (0.6, 1)" in r.output
    assert ratio("--steps", mixed, extra=("--temperature", "0.6"))["clip_frac"] >= 0  # an explicit T trains them
