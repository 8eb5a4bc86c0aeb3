"""The proposer bench's synthetic engine steps: what a draft is credited with, and in `--verify`
mode, that a row keeps exactly what verification of its last draft would keep."""

import numpy as np

from bench.proposer_bench import Batch, Workload, matched


def test_matched_is_the_longest_agreeing_prefix():
    resp = np.array([5, 6, 7, 8], dtype=np.int32)
    assert matched([6, 7, 9], resp, 1) == 2
    assert matched([5, 6, 7, 8], resp, 0) == 4
    assert matched([9, 6], resp, 1) == 0  # a wrong first token keeps nothing after it
    assert matched([8, 1, 2], resp, 3) == 1  # the response ends: nothing past it counts
    assert matched([], resp, 0) == 0


def decoding_batch(verify: bool) -> Batch:
    batch = Batch(Workload(seed=3, k=2, tokens=64, prompts=8), rows=4, verify=verify)
    for r in batch.reqs:
        r[3], r[4] = 0, True  # every row decoding from the start of its response
    batch.num[:] = len(batch.work.prompts[0])
    return batch


def test_verified_rows_keep_the_accepted_draft_and_one_token():
    batch = decoding_batch(verify=True)
    rights = [0, 2, 5, 3]
    for r, k in zip(batch.reqs, rights):
        resp = r[2]
        r[5] = resp[:k].tolist() + [int(resp[k]) + 1] * 2  # right for k tokens, then wrong
    sampled = batch.step()
    assert [len(s) for s in sampled] == [k + 1 for k in rights]
    for s, r in zip(sampled, batch.reqs):
        assert s == r[2][: len(s)].tolist()
        assert r[3] == len(s)


def test_open_loop_rows_keep_one_to_four_tokens_whatever_was_drafted():
    batch = decoding_batch(verify=False)
    for r in batch.reqs:
        r[5] = r[2][:8].tolist()  # a perfect draft changes nothing here
    kept = [len(s) for _ in range(10) for s in batch.step()]
    assert min(kept) >= 1 and max(kept) <= 4 and len(set(kept)) > 1


def test_catch_up_shows_each_first_row_its_tokens_so_far():
    batch = Batch(Workload(seed=5, k=2, tokens=64, prompts=8), rows=6)
    caught = batch.catch_up()
    for toks, r, n in zip(caught, batch.reqs, batch.num):
        assert toks == r[2][: r[3]].tolist()
        assert n == len(batch.work.prompts[0]) + len(toks)  # the row holds its prompt, then these
    assert any(caught) and all(r[4] == bool(r[3]) for r in batch.reqs)


def test_history_comes_before_a_prompts_first_request():
    work = Workload(seed=1, k=2, tokens=32, prompts=4, history=3)
    seen: list = []
    work.earlier = lambda prompt, responses: seen.append((prompt, [len(r) for r in responses]))
    for _ in range(4):
        _, p, _ = work.request()
        assert seen[-1][0] == work.prompts[p]
    assert [lens for _, lens in seen] == [[32] * 3] * 2  # once per prompt, K requests each


def test_the_second_run_loads_every_prompt_from_what_the_first_committed(tmp_path):
    import argparse

    from bench.proposer_bench import warm_proposer

    args = argparse.Namespace(tokens=64, fixed_budget=False, load_steps=0, rows=8, verify=False, steps=60)
    warm = warm_proposer(args, str(tmp_path), lambda: Workload(seed=2, k=4, tokens=64, prompts=40))
    store = warm.session.link.store
    assert len(store.uids()) >= 2 and all(store.read(u) for u in store.uids())
    batch = Batch(Workload(seed=2, k=4, tokens=64, prompts=40), 8)
    warm.propose(batch.catch_up(), batch.num, batch.ids)
    assert warm.session.trees.hits == warm.session.trees.loaded > 0  # every prompt it met was in the cache
