"""Exactness on the real pretrained model (SmolLM2-135M-Instruct, a 49,152-token vocabulary,
prepared by examples/smollm2/prepare.py; skipped without it):

- greedy `srt rollout` drafting from a warm cache emits exactly what plain decoding (`--draft
  none`) and transformers' own greedy `generate` emit;
- sampling at temperature 1 with drafts from the prompt's tree follows the model's own
  distributions (chi-square against the model's p, one forward per checked context), and the
  design seed's biased rule (greedy drafts verified as if sampled from the tree's frequencies)
  fails the same test.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from srtcli.models import load_model_and_tokenizer
from srtcli.pool import read_pool
from srtcli.rollout.config import RolloutConfig
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.driver import run_rollout
from srtcli.rollout.embedded import EmbeddedBackend
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.sampling import SamplingParams
from srtcli.rollout.engine.sequence import Sequence
from srtcli.tokenizers import encode_prompt
from tests.srtcli.rollout.engine.test_engine_sampling import SeedDrafter
from tests.srtcli.rollout.engine.test_verify import p_value

WORKLOAD = "examples/smollm2/prompts.jsonl"
NEW, SAMPLES = 40, 3000


@pytest.fixture(scope="module")
def loaded(real_model):
    torch.set_num_threads(2)
    return load_model_and_tokenizer(real_model)


def rollout(real_model, prompts, tmp_path, draft: str, cache: str, out: str) -> dict:
    config = RolloutConfig(str(prompts), model=str(real_model), k=2, max_new_tokens=NEW, temperature=0.0, draft=draft,
                           cache_opt=str(tmp_path / cache), out=str(tmp_path / out), threads=2)
    return run_rollout(config, EmbeddedBackend("cpu"))


def outputs(pool) -> dict[tuple[str, int], list[int]]:
    """Each trajectory's generated tokens (its last step's loss-masked tokens)."""
    return {(s.prompt_uid, s.meta["sample"]): [t for t, m in zip(s.input_ids, s.loss_mask) if m]
            for s in read_pool(pool)}


def test_greedy_with_a_warm_cache_is_plain_decoding_and_hf_generate(real_model, loaded, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    records = [json.loads(line) for line in open(WORKLOAD)][:3]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    rollout(real_model, prompts, tmp_path, "srt", "cache", "cold")
    warm = rollout(real_model, prompts, tmp_path, "srt", "cache", "warm")
    assert warm["cache_hit_rate"] == 1.0 and warm["accepted_draft_tokens"] > 0  # drafts were verified
    rollout(real_model, prompts, tmp_path, "none", "cache-none", "plain")
    srt, plain = outputs(tmp_path / "warm"), outputs(tmp_path / "plain")
    assert srt == plain
    model, tok = loaded
    for rec, key in zip(records, sorted(srt, key=lambda k: list(srt).index(k))[::2]):
        ids = torch.tensor([encode_prompt(tok, rec["prompt"])])
        with torch.inference_mode():
            hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        if tok.eos_token_id in hf:
            hf = hf[: hf.index(tok.eos_token_id) + 1]
        assert srt[key] == hf


def sampled(model, tok, drafter) -> tuple[list[tuple[int, ...]], Engine]:
    """SAMPLES continuations of 3 tokens of one real prompt at temperature 1, all in one group:
    the later samples draft from the tree the earlier ones filled (every draft verified)."""
    prompt = encode_prompt(tok, json.loads(open(WORKLOAD).readline())["prompt"])
    eng = Engine(model, SamplingParams(1.0), drafter, slots=64, budget=2, max_len=len(prompt) + 4, seed=7,
                 draft_length="fixed")
    seqs = [Sequence(prompt, max_new_tokens=3, group="g") for _ in range(SAMPLES)]
    todo = list(seqs)
    while todo or eng.active():
        while todo and eng.free_slots():
            eng.admit(todo.pop())
        eng.step()
    return [tuple(s.output) for s in seqs], eng


@torch.inference_mode()
def fit(model, tok, outs: list[tuple[int, ...]]) -> float:
    """Chi-square p-value of the second token given the commonest first one, and of the third
    given the commonest first two, against the model's own p there (bins expected below 5
    samples pooled); the smaller of the two."""
    prompt = encode_prompt(tok, json.loads(open(WORKLOAD).readline())["prompt"])
    pvalues = []
    for depth in (1, 2):
        context = Counter(o[:depth] for o in outs).most_common(1)[0][0]
        nxt = Counter(o[depth] for o in outs if o[:depth] == context)
        n = sum(nxt.values())
        p = torch.softmax(model(torch.tensor([prompt + list(context)])).logits[0, -1].double(), -1)
        big = [t for t in range(len(p)) if p[t] * n >= 5]
        counts = [nxt.get(t, 0) for t in big] + [n - sum(nxt.get(t, 0) for t in big)]
        probs = [float(p[t]) for t in big] + [1.0 - float(p[big].sum())]
        pvalues.append(p_value(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64)))
    return min(pvalues)


def test_sampling_with_drafts_is_the_real_models_distribution(loaded):
    model, tok = loaded
    outs, eng = sampled(model, tok, SrtDrafter(mode="sample"))
    assert eng.stats.accepted > 0.1 * SAMPLES  # drafts really were verified
    assert fit(model, tok, outs) > 1e-3


def test_the_seeds_biased_rule_is_caught_on_the_real_model(loaded):
    model, tok = loaded
    outs, eng = sampled(model, tok, SeedDrafter())
    assert eng.stats.accepted > 0.1 * SAMPLES
    assert fit(model, tok, outs) < 1e-6
