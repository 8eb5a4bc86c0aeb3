"""The heart: packed tree forwards give exactly what separate forwards give.

Real transformers classes (Qwen2, Llama) with tiny random configs (RoPE, grouped-query
attention), float32 on CPU. Log-probs must agree to 1e-4 (max abs), gradients of the summed
log-probs to 1e-4 relative, on every case of the packing design, on random forests, and for every
backend; a wrong mask or wrong position ids must fail the same check.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention import PackedRow, pack_rows, row_logprobs, tree_logprobs
from tests.attention.conftest import assert_grads_close, grads, max_diff, separate_logprobs, tiny_model

TOL = 1e-4


def _rand(rng, n, vocab=100):
    return [rng.randrange(vocab) for _ in range(n)]


def case_k_samples(rng):
    prompt = _rand(rng, 12)
    return [[prompt + _rand(rng, rng.randint(1, 8)) for _ in range(4)]]


def case_multi_turn(rng):
    group = []
    prompt = _rand(rng, 6)
    for t in range(2):
        seq = list(prompt)
        for _ in range(3):  # step k+1 extends step k: response, tool output, response ...
            seq = seq + _rand(rng, rng.randint(2, 5))
            group.append(list(seq))
    return [group]


def case_duplicates(rng):
    s = _rand(rng, 9)
    return [[s, list(s), s[:4], list(s)]]


def case_one_token(rng):
    s = _rand(rng, 7)
    return [[[s[0]], s, [rng.randrange(100)]]]


def case_sharing_nothing(rng):
    return [[[1] + _rand(rng, 5), [2] + _rand(rng, 6), [3] + _rand(rng, 3)]]


def case_several_groups(rng):
    return case_k_samples(rng) + case_multi_turn(rng) + case_duplicates(rng)


CASES = {
    "k_samples": (case_k_samples, 256),
    "multi_turn": (case_multi_turn, 256),
    "duplicates": (case_duplicates, 256),
    "one_token": (case_one_token, 256),
    "sharing_nothing": (case_sharing_nothing, 256),
    "several_groups_one_row": (case_several_groups, 256),
    "split_group": (case_k_samples, 24),  # the 4-sample tree (>= 16 tokens) cannot fit 24 tokens whole
}


def packed_all(model, rows: list[PackedRow], n: int, **kw) -> list[torch.Tensor]:
    out: list = [None] * n
    for row in rows:
        for sid, lp in zip(row.seq_ids, row_logprobs(model, row, **kw)):
            out[sid] = lp
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_logprobs_and_grads_match_separate_forwards(model, case):
    make, max_tokens = CASES[case]
    groups = make(random.Random(case))
    seqs = [s for g in groups for s in g]
    rows = pack_rows(groups, max_tokens=max_tokens, pad_to=16)
    if case == "split_group":
        assert len(rows) > 1
    if case == "several_groups_one_row":
        assert len(rows) == 1
    want = [separate_logprobs(model, s) for s in seqs]
    got = packed_all(model, rows, len(seqs), backend="sdpa")
    assert max_diff(got, want) <= TOL
    weights = torch.linspace(0.5, 1.5, len(seqs))  # distinct weights: a swapped path would show
    ref = grads(model, lambda: sum(w * separate_logprobs(model, s).sum() for w, s in zip(weights, seqs)))
    tree = grads(model, lambda: sum(w * lp.sum() for w, lp in zip(weights, packed_all(model, rows, len(seqs)))))
    assert_grads_close(tree, ref, TOL)


def test_sdpa_query_blocks_are_exact_with_grads(monkeypatch):
    import attention.hf

    monkeypatch.setattr(attention.hf, "SDPA_BLOCK", 5)  # many blocks, split mid-node and mid-tree
    model = tiny_model("llama")
    groups = case_several_groups(random.Random(6))
    seqs = [s for g in groups for s in g]
    rows = pack_rows(groups, max_tokens=256, pad_to=16)
    assert len(rows[0]) > 5 * 4
    assert max_diff(packed_all(model, rows, len(seqs)), [separate_logprobs(model, s) for s in seqs]) <= TOL
    ref = grads(model, lambda: sum(separate_logprobs(model, s).sum() for s in seqs))
    tree = grads(model, lambda: sum(lp.sum() for lp in packed_all(model, rows, len(seqs))))
    assert_grads_close(tree, ref, TOL)


def test_a_blocked_backward_that_drops_gathered_key_gradients_is_caught(monkeypatch):
    """WRONG on purpose: the blocked attention's backward adds the gradients of contiguous key
    ranges only, dropping those of keys gathered from earlier in the tree."""
    import attention.hf

    add_keys = attention.hf._add_keys
    monkeypatch.setattr(attention.hf, "SDPA_BLOCK", 5)
    monkeypatch.setattr(attention.hf, "_add_keys",
                        lambda total, keys, grad: add_keys(total, keys, grad) if isinstance(keys, slice) else None)
    model = tiny_model("llama")
    groups = case_several_groups(random.Random(6))
    seqs = [s for g in groups for s in g]
    rows = pack_rows(groups, max_tokens=256, pad_to=16)
    ref = grads(model, lambda: sum(separate_logprobs(model, s).sum() for s in seqs))
    tree = grads(model, lambda: sum(lp.sum() for lp in packed_all(model, rows, len(seqs))))
    with pytest.raises(AssertionError):
        assert_grads_close(tree, ref, TOL)


@pytest.mark.parametrize("backend", ["eager", "flex"])
def test_other_backends_match(backend):
    model = tiny_model("qwen2")
    groups = case_several_groups(random.Random(1))
    seqs = [s for g in groups for s in g]
    rows = pack_rows(groups, max_tokens=256, pad_to=128)
    want = [separate_logprobs(model, s) for s in seqs]
    with torch.no_grad():  # CPU FlexAttention has no backward (eager checks grads below)
        got = packed_all(model, rows, len(seqs), backend=backend)
    assert max_diff(got, want) <= TOL
    if backend == "eager":
        ref = grads(model, lambda: sum(separate_logprobs(model, s).sum() for s in seqs))
        tree = grads(model, lambda: sum(lp.sum() for lp in packed_all(model, rows, len(seqs), backend="eager")))
        assert_grads_close(tree, ref, TOL)


def _corrupt(row: PackedRow, what: str) -> PackedRow:
    t = len(row)
    if what == "positions":  # the packed index instead of the depth
        return PackedRow(row.input_ids, torch.arange(t), row.subtree_end, row.paths, row.seq_ids, row.n_real)
    if what == "causal_mask":  # plain causal packing: every token sees all earlier siblings
        return PackedRow(row.input_ids, row.position_ids, torch.full((t,), t - 1), row.paths, row.seq_ids, row.n_real)
    # off by one: each subtree reaches one token too far, so a next sibling's first token sees it
    # (one too short would be harmless for log-probs: a subtree's last token is a leaf that predicts nothing)
    end = (row.subtree_end + 1).clamp_max(row.n_real - 1)
    return PackedRow(row.input_ids, row.position_ids, end, row.paths, row.seq_ids, row.n_real)


@pytest.mark.parametrize("what", ["positions", "causal_mask", "long_subtree"])
def test_a_wrong_mask_or_wrong_positions_fails_the_check(what):
    model = tiny_model("qwen2")
    groups = case_k_samples(random.Random(3))
    seqs = groups[0]
    row = pack_rows(groups, max_tokens=256, pad_to=1)[0]
    want = [separate_logprobs(model, s) for s in seqs]
    with torch.no_grad():
        assert max_diff(packed_all(model, [row], len(seqs)), want) <= TOL  # the right row passes
        bad = packed_all(model, [_corrupt(row, what)], len(seqs))
    assert max_diff(bad, want) > 100 * TOL


def test_entropy_and_chunking():
    model = tiny_model("llama")
    groups = case_several_groups(random.Random(5))
    seqs = [s for g in groups for s in g]
    rows = pack_rows(groups, max_tokens=256, pad_to=1)
    with torch.no_grad():
        ref = [separate_logprobs(model, s, entropy=True) for s in seqs]
        for chunk in (3, 1024):  # many small LM-head chunks, and one
            lps: list = [None] * len(seqs)
            ents: list = [None] * len(seqs)
            for row in rows:
                lp, ent = row_logprobs(model, row, entropy=True, chunk_size=chunk)
                for i, sid in enumerate(row.seq_ids):
                    lps[sid], ents[sid] = lp[i], ent[i]
            assert max_diff(lps, [r[0] for r in ref]) <= TOL
            assert max_diff(ents, [r[1] for r in ref]) <= TOL


def test_tree_logprobs_input_order_and_split_rows():
    model = tiny_model("qwen2")
    rng = random.Random(9)
    seqs = case_k_samples(rng)[0] + case_multi_turn(rng)[0] + [[5]]
    with torch.no_grad():
        want = [separate_logprobs(model, s) for s in seqs]
        assert max_diff(tree_logprobs(model, seqs), want) <= TOL
        assert max_diff(tree_logprobs(model, seqs, max_tokens=30), want) <= TOL
        lps, ents = tree_logprobs(model, seqs, entropy=True)
        assert len(ents) == len(seqs) and ents[-1].numel() == 0


def test_full_logits_fallback_for_post_processed_heads():
    model = tiny_model("llama")
    model.config.final_logit_softcapping = 30.0  # Llama ignores it; srt then scores full logits
    seqs = case_k_samples(random.Random(2))[0]
    with torch.no_grad():
        assert max_diff(tree_logprobs(model, seqs), [separate_logprobs(model, s) for s in seqs]) <= TOL


def test_ordinary_inputs_take_the_ordinary_path():
    from attention.hf import NAME, register

    model = tiny_model("qwen2")
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    att = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=att).logits
        tree_logprobs(model, [[1, 2, 3], [1, 2, 4]])
        assert model.config._attn_implementation == "sdpa"  # restored after the tree forward
        register()
        model.config._attn_implementation = NAME  # outside a row, srt_tree is plain sdpa
        got = model(input_ids=ids, attention_mask=att).logits
    keep = att.bool()
    assert (got - want)[keep].abs().max().item() <= 1e-5


def test_sliding_window_models_stay_exact():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, use_sliding_window=True, sliding_window=4, max_window_layers=0, attn_implementation="sdpa", initializer_range=0.1,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    seqs = case_k_samples(random.Random(4))[0]
    with torch.no_grad():
        want = [separate_logprobs(model, s) for s in seqs]
        assert max_diff(tree_logprobs(model, seqs), want) <= TOL


forests = st.lists(
    st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=14), min_size=1, max_size=5), min_size=1, max_size=3
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(forests, st.integers(16, 48))
def test_random_forests_are_exact(groups, max_tokens):
    model = _shared_model()
    seqs = [s for g in groups for s in g]
    rows = pack_rows(groups, max_tokens=max_tokens, pad_to=8)
    with torch.no_grad():
        want = [separate_logprobs(model, s) for s in seqs]
        assert max_diff(packed_all(model, rows, len(seqs)), want) <= TOL


_MODEL = {}


def _shared_model():
    if "m" not in _MODEL:
        _MODEL["m"] = tiny_model("qwen2", seed=7, vocab=5)
    return _MODEL["m"]


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex"])
def test_padding_rows_are_finite(backend):
    from attention import tree_attention

    model = tiny_model("qwen2")
    row = pack_rows([[[1, 2, 3], [1, 2, 4]]], max_tokens=64, pad_to=128)[0]
    assert len(row) - row.n_real > 100
    with torch.no_grad(), tree_attention(model, row.subtree_end, row.position_ids, backend):
        logits = model(input_ids=row.input_ids[None], position_ids=row.position_ids[None], use_cache=False).logits
    assert bool(torch.isfinite(logits).all())  # a pad token attends to itself: no empty softmax row
