"""srt's rollout_func inside a real TRL GRPOTrainer: greedy completions equal TRL's own generation
token for token, sampled completions follow the policy (a chi-square over whole continuations; a
biased drafter fails it), a training step runs end to end with a second call drafting from the
first call's stored trees, and srt's tools run between turns with their output masked (env_mask)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from trl import GRPOConfig, GRPOTrainer

from srtcli.rollout.engine.sampling import SamplingParams, shape_probs
from srtcli.trl.rollout import srt_rollout_func
from tests.srtcli.rollout.engine.test_engine_sampling import SeedDrafter, fit

QUESTIONS = [
    "Omar has 94 pens and gives away 6. How many pens are left?",
    "There are 5 books on a table and 4 more in a drawer. How many books are there in all?",
    "Ana has 12 apples and eats 3. How many apples are left?",
    "A box holds 7 red balls and 8 blue balls. How many balls are in the box?",
]


def reward_len(completions, **kw):
    return [float(len(str(c))) for c in completions]


def bundled():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srtcli.models import default_model_dir

    d = default_model_dir()
    return AutoModelForCausalLM.from_pretrained(str(d)).float(), AutoTokenizer.from_pretrained(str(d))


def trainer_for(model, tok, tmp_path, rollout=None, prompts=QUESTIONS, **args):
    cfg = {"output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True, "bf16": False, "max_steps": 1,
           "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 24,
           "logging_steps": 1, "save_strategy": "no", "seed": 0, "disable_tqdm": True, **args}
    ds = datasets.Dataset.from_dict({"prompt": list(prompts)})
    return GRPOTrainer(model=model, reward_funcs=reward_len, args=GRPOConfig(**cfg), train_dataset=ds,
                       processing_class=tok, rollout_func=rollout)


def chat(q):
    return [{"role": "user", "content": q}]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("conversational", [True, False])
def test_greedy_completions_equal_trls_own_generation(tmp_path, conversational, monkeypatch):
    import srtcli.rollout.engine.engine as engine_module

    models = []

    class Spy(engine_module.Engine):
        def __init__(self, model, *a, **kw):
            models.append(model)
            super().__init__(model, *a, **kw)

    monkeypatch.setattr(engine_module, "Engine", Spy)
    model, tok = bundled()
    rollout = srt_rollout_func(budget=4, draft_length="fixed")  # drafts verified whatever they cost
    trainer = trainer_for(model, tok, tmp_path, rollout, generation_kwargs={"do_sample": False})
    prompts = [chat(q) if conversational else q for q in QUESTIONS[:3] for _ in range(2)]  # as RepeatSampler
    trainer.model.train()
    ours = rollout(prompts, trainer)
    assert trainer.model.training  # generated in eval mode, the train mode restored after
    ids, _, _ = trainer._tokenize_prompts(prompts)
    theirs, _ = trainer._generate_single_turn(ids, None, {}, 2)  # TRL's transformers `generate` path
    assert ours["prompt_ids"] == [list(p) for p in ids]
    assert ours["completion_ids"] == theirs
    assert len(models) == 1  # one engine per call
    assert models[0] is trainer.model  # on the trainer's model itself, no copy
    assert all(len(c) > 3 for c in theirs)
    assert ours["logprobs"] == [[0.0] * len(c) for c in theirs]  # greedy: a point mass
    assert rollout.last["accepted"] > 0  # drafts were verified, not only plain decoding
    rollout.close()


def exact_continuations(model, prompt, eos, params, new):
    """P(whole completion) for every completion of up to `new` tokens (ending early at an eos),
    by enumeration."""
    vocab = model.config.vocab_size
    out: dict[tuple, float] = {}
    frontier = [((), 1.0)]
    with torch.no_grad():
        for depth in range(new):
            batch = torch.tensor([prompt + list(c) for c, _ in frontier])
            p = shape_probs(model(batch).logits[:, -1], params).double()
            nxt = []
            for (c, pc), row in zip(frontier, p.tolist()):
                for t in range(vocab):
                    if row[t] == 0.0:
                        continue
                    seq = c + (t,)
                    if t in eos or depth == new - 1:
                        out[seq] = out.get(seq, 0.0) + pc * row[t]
                    else:
                        nxt.append((seq, pc * row[t]))
            frontier = nxt
    return out


def test_sampling_follows_the_policy_and_a_biased_drafter_is_caught(tmp_path):
    from srtcli.tiny_model import chat_tokenizer, tiny_model

    tok = chat_tokenizer(tmp_path / "tok")
    model = tiny_model("qwen2", vocab=len(tok), seed=3, sharp=15.0, tie_word_embeddings=False)
    n, new, prompt = 3000, 3, "7+5="

    def counts(draft):
        rollout = srt_rollout_func(budget=4, draft=draft, draft_length="fixed")
        trainer = trainer_for(model, tok, tmp_path, rollout, prompts=[prompt], max_completion_length=new,
                              temperature=1.0)
        out = rollout([prompt] * n, trainer)
        c: dict[tuple, int] = {}
        for ids, lps in zip(out["completion_ids"], out["logprobs"]):
            assert len(lps) == len(ids) and all(lp <= 0.0 for lp in lps)
            c[tuple(ids)] = c.get(tuple(ids), 0) + 1
        rollout.close()
        return c, rollout.last, trainer

    good, stats, trainer = counts("srt")
    probs = exact_continuations(model, tok(prompt)["input_ids"], set(trainer.eos_token_ids), SamplingParams(1.0), new)
    assert abs(sum(probs.values()) - 1.0) < 1e-6
    assert stats["accepted"] > 0.02 * n  # drafting was really exercised (as srt's own engine test)
    assert fit(good, probs) > 1e-3
    bad, stats, _ = counts(SeedDrafter())  # greedy drafts verified as if sampled: biased
    assert stats["accepted"] > 0.05 * n
    assert fit(bad, probs) < 1e-6


def test_a_training_step_runs_and_a_second_call_drafts_from_the_first_calls_trees(tmp_path):
    model, tok = bundled()
    rollout = srt_rollout_func(cache=tmp_path / "cache", budget=8, draft_length="fixed")
    seen = []

    def spy(prompts, trainer):
        out = rollout(prompts, trainer)
        seen.append((prompts, out, dict(rollout.last)))
        return out

    trainer = trainer_for(model, tok, tmp_path, spy, prompts=[chat(q) for q in QUESTIONS], temperature=1.0)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert rollout.session is None  # closed when training ended
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))  # a real step
    (prompts, out, first), = seen
    k = trainer.args.num_generations
    # TRL hands the repeated prompts: each one num_generations times in a row (RepeatSampler)
    assert len(prompts) == trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert all(prompts[i] == prompts[i - i % k] for i in range(len(prompts)))
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["logprobs"]) == len(prompts)
    for ids, lps in zip(out["completion_ids"], out["logprobs"]):
        assert 0 < len(ids) <= trainer.args.max_completion_length and len(lps) == len(ids)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in lps)
    assert first["cache_hit_rate"] == 0.0
    again = rollout(prompts, trainer)  # opens the cache again: the first call's groups are stored
    second = rollout.last
    rollout.close()
    assert len(again["completion_ids"]) == len(prompts)
    assert second["cache_hit_rate"] == 1.0
    assert second["accepted_per_forward"] > first["accepted_per_forward"]


def test_admission_is_sample_major():
    from srtcli.rollout.engine.sequence import Sequence
    from srtcli.trl.rollout import admission

    seqs = [Sequence([1], 1, group=g, meta={"i": i}) for i, g in enumerate("aabbbc")]
    assert [s.meta["i"] for s in admission(seqs)] == [0, 2, 5, 1, 3, 4]


def test_the_srt_drafter_gets_srt_rollouts_options_and_defaults(tmp_path):
    """The TRL rollout drafts as `srt rollout` does: the same drafter options, the same defaults."""
    import dataclasses

    from srtcli.rollout.config import RolloutConfig

    defaults = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}
    built = srt_rollout_func(cache=None)._drafter(sampling=True)
    assert (built.session.trees.shared is not None, built.stop, built.session.trees.load_tokens) == \
        (defaults["shared_tree"], defaults["draft_stop"], defaults["load_tokens"])
    assert (built.mode, built.min_prob) == (defaults["draft_mode"], defaults["min_prob"])
    other = srt_rollout_func(cache=None, shared_tree=False, draft_stop=False, load_tokens=1000)._drafter(True)
    assert (other.session.trees.shared, other.stop, other.session.trees.load_tokens) == (None, False, 1000)


def test_tools_run_between_turns_and_their_output_is_masked(tmp_path):
    import re

    from srtcli.rollout.agent.calculator import calculator

    model, tok = bundled()
    rollout = srt_rollout_func(budget=4, tools="calculator")
    trainer = trainer_for(model, tok, tmp_path, rollout, max_completion_length=48)
    prompts = [chat(q) for q in QUESTIONS for _ in range(2)]
    out = rollout(prompts, trainer)
    rollout.close()
    called = 0
    for ids, lps, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"]):
        assert len(ids) == len(lps) == len(mask) and set(mask) <= {0, 1}
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if m == 0)
        assert sum(mask) <= trainer.args.max_completion_length  # the model's own tokens
        text = ""
        for t, m in zip(ids, mask):  # the text, tool output in [[ ]]
            text += ("[[" if m == 0 else "") + tok.decode([t]) + ("]]" if m == 0 else "")
        text = text.replace("]][[", "")
        for expr, result in re.findall(r"<calc>(.*?)</calc>\[\[(.*?)\]\]", text):
            assert calculator(expr) in result  # srt's calculator answered the model's call
            called += 1
        assert "[[" not in re.sub(r"<calc>(.*?)</calc>\[\[(.*?)\]\]", "", text)  # only tool output is masked
    assert called > 0
    trainer.train()  # TRL takes env_mask as its tool mask: a step runs with it
    assert trainer.state.global_step == 1
