"""The engine: greedy output token-identical to plain greedy decoding for every drafter, in
ragged, continuously refilled batches, on real HF Llama and Qwen2 classes; a variant without
KV rollback is caught; tool turns inject non-trained tokens and continue exactly."""

from __future__ import annotations

import pytest
import torch

from srtcli.rollout.drafters import make_drafter
from srtcli.rollout.drafters.base import Proposal
from srtcli.rollout.drafters.srt import SrtDrafter
from srtcli.rollout.engine.engine import Engine
from srtcli.rollout.engine.forward import ForwardPass
from srtcli.rollout.engine.sequence import Sequence
from srtcli.rollout.engine.sampling import SamplingParams
from tests.srtcli.rollout.engine.support import plain_greedy, tiny_model

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6], [7, 7]]


def drive(engine: Engine, seqs: list[Sequence]) -> None:
    todo = list(seqs)
    while todo or engine.active():
        while todo and engine.free_slots():
            engine.admit(todo.pop(0))
        engine.step()


def greedy_run(model, drafter, slots=3, budget=5, eos=frozenset(), engine_cls=Engine, draft_length="fixed"):
    """Greedy decoding of ragged sequences; every draft verified (`fixed`) unless asked otherwise."""
    eng = engine_cls(model, SamplingParams(temperature=0), drafter, slots=slots, budget=budget,
                     max_len=128, eos_ids=eos, draft_length=draft_length)
    # groups repeat so the srt/suffix trees have something to draft from
    seqs = [Sequence(p, max_new_tokens=8 + 3 * i, group=str(i % 6)) for i, p in enumerate(PROMPTS * 2)]
    drive(eng, seqs)
    return eng, seqs


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("draft", ["none", "ngram", "suffix", "srt"])
def test_greedy_is_token_identical_to_plain_greedy(kind, draft):
    model = tiny_model(kind, sharp=4.0)
    eos = {5}
    eng, seqs = greedy_run(model, make_drafter(draft), eos=eos)
    for s in seqs:
        assert s.output == plain_greedy(model, s.prompt_ids, s.max_new_tokens, eos)
        assert s.finish_reason in ("stop", "length")
        assert s.logprobs[len(s.prompt_ids):] == [0.0] * len(s.output)
    if draft != "none":
        assert eng.stats.accepted > 0  # drafts really were accepted, and rejected ones rolled back
        assert eng.stats.accepted < eng.stats.drafted
        assert eng.accepted_per_forward > 1.0


@pytest.mark.parametrize("draft", ["srt", "ngram"])
def test_greedy_under_the_cost_rule_is_token_identical_to_plain_greedy(draft):
    # the rule cuts each step's drafts by timings (its cuts vary run to run): greedy output never does
    model = tiny_model("qwen2", sharp=4.0)
    eng, seqs = greedy_run(model, make_drafter(draft), eos={5}, draft_length="cost")
    assert eng.draft_cost is not None and eng.draft_cost.forward.forwards > 0  # the rule ran, timed
    for s in seqs:
        assert s.output == plain_greedy(model, s.prompt_ids, s.max_new_tokens, {5})


def leaky_visible(pos, keys):
    """Deliberately wrong mask: every column up to the batch's furthest position is visible, so
    stale KV (rejected drafts, positions past a row's own length) leaks into later tokens."""
    return (keys[None, None, :] <= pos[:, :, None]) | (keys[None, None, :] < pos.max())


class JunkDrafter(SrtDrafter):
    """Proposes a fixed junk token, so most drafts are rejected."""

    def propose(self, seq, budget):
        return Proposal([11] * budget)


def test_if_rejected_positions_stay_visible_the_output_is_wrong(monkeypatch):
    model = tiny_model("qwen2", sharp=4.0)
    _, ok = greedy_run(model, JunkDrafter())
    assert all(s.output == plain_greedy(model, s.prompt_ids, s.max_new_tokens) for s in ok)
    monkeypatch.setattr(ForwardPass, "_visible", staticmethod(leaky_visible))
    _, bad = greedy_run(model, JunkDrafter())
    assert any(s.output != plain_greedy(model, s.prompt_ids, s.max_new_tokens) for s in bad)


def test_tool_turns_inject_untrained_tokens_and_continue_exactly():
    model = tiny_model("llama", sharp=4.0)
    inject = [40, 41, 42]

    def stop_fn(seq, emitted):  # end a turn after its 4th generated token, twice
        n = len(seq.tokens) - seq.turn_start
        if len(seq.turns) < 2 and n + len(emitted) >= 4:
            return 4 - n
        return None

    eng = Engine(model, SamplingParams(temperature=0), make_drafter("ngram"), slots=2, budget=4,
                 max_len=128, stop_fn=stop_fn, turn_end=lambda seq: list(inject), draft_length="fixed")
    seqs = [Sequence(p, max_new_tokens=12) for p in PROMPTS[:3]]
    drive(eng, seqs)
    for s in seqs:
        assert len(s.turns) == 3
        # replay: greedy turn by turn with the injected tokens in between
        ids = list(s.prompt_ids)
        for i, (start, end) in enumerate(s.turns):
            assert start == len(ids)
            ids += plain_greedy(model, ids, end - start)
            assert ids == s.tokens[:end]
            if i < 2:
                assert s.tokens[end:end + 3] == inject and s.mask[end:end + 3] == [0, 0, 0]
                ids += inject
        assert sum(s.mask) == s.generated == 12


class ShortCopy(Engine):
    """Deliberately wrong prefix sharing: copies only the first half of the prompt's KV."""

    def _follow(self, followers):
        copy = self.kv_cache.copy_prefix
        self.kv_cache.copy_prefix = lambda src, dst, n: copy(src, dst, n // 2)
        try:
            return super()._follow(followers)
        finally:
            self.kv_cache.copy_prefix = copy


@pytest.mark.parametrize("engine_cls,exact", [(Engine, True), (ShortCopy, False)])
def test_samples_of_one_prompt_share_its_prefill(engine_cls, exact):
    model = tiny_model("llama", sharp=4.0)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
    eng = engine_cls(model, SamplingParams(temperature=0), make_drafter("none"), slots=3, budget=0, max_len=64)
    seqs = [Sequence(prompt, max_new_tokens=6, group="g") for _ in range(7)]
    drive(eng, seqs)
    want = plain_greedy(model, prompt, 6)
    assert all(s.output == want for s in seqs) == exact
    if exact:
        # one prefill forward for the first slots' leader, then later samples copy live slots
        assert eng.stats.forwards < 7 * 6


def test_prompt_kv_registry_is_empty_after_a_run():
    model = tiny_model("qwen2", sharp=4.0)
    eng, _ = greedy_run(model, make_drafter("srt"))
    assert eng._prompts == {} and eng.active() == []


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_packed_forward_for_every_uneven_forward_is_token_identical(kind, split, monkeypatch):
    """With PACK_MIN_PADDING = 1 every forward with any padding runs packed ([1, T] input,
    index-mapped attention), its attention split into every row's last query plus the rows
    with more (or never split); greedy output must still equal plain greedy decoding."""
    import srtcli.rollout.engine.forward as forward_mod
    import srtcli.rollout.engine.kv_cache as kv_mod

    monkeypatch.setattr(forward_mod, "PACK_MIN_PADDING", 1)
    monkeypatch.setattr(kv_mod, "split_pays", lambda rows, multi, q: split and q > 1 and multi > 0)
    packed, padded_pad = [], []
    model_forward, forward_padded = ForwardPass._model_forward, ForwardPass._forward_padded

    def count_model_forward(self, ids, pos, mask, keep, pk, rows, windows=None):
        packed.append(pk is not None)
        return model_forward(self, ids, pos, mask, keep, pk, rows, windows)

    def record_padded(self, rows, inputs, dls):
        padded_pad.append(len(inputs) * max(map(len, inputs)) - sum(map(len, inputs)))
        return forward_padded(self, rows, inputs, dls)

    monkeypatch.setattr(ForwardPass, "_model_forward", count_model_forward)
    monkeypatch.setattr(ForwardPass, "_forward_padded", record_padded)
    model = tiny_model(kind, sharp=4.0)
    eng, seqs = greedy_run(model, make_drafter("ngram"), eos={5})
    for s in seqs:
        assert s.output == plain_greedy(model, s.prompt_ids, s.max_new_tokens, {5})
    assert eng.stats.accepted > 0  # ragged drafts: accepted and rejected ones
    assert sum(packed) > 0  # the packed path really ran
    assert padded_pad.count(0) == len(padded_pad) == packed.count(False)  # only even forwards padded
