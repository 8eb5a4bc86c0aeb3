"""The SRT proposer as any vLLM user gets it, without vLLM and without a driver: prompts found
as rows first appear, one tree per prompt shared by its rows (also rows that come after the
first ended), requests that leave the batch and come back, commits batched as sequences end
(by count, by age, when idle, before a tree leaves memory, at process exit), on real LMDB; and
the tokenizer fingerprint the worker computes is srt's."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cache_store.seqstore import LmdbSequenceStore
from cache_store.uid import prompt_uid
from srtcli.store_link import StoreLink
from srtcli.errors import SrtError
from srtcli.rollout.vllm import row_tracking
from srtcli.rollout.vllm.commits import commit_settings
from srtcli.rollout.vllm.settings import ProposerSettings
from srtcli.rollout.vllm.tree_drafts import TreeDrafts
from srtcli.rollout.vllm.worker_facts import ModelFacts, completed, facts_of, load_worker_tokenizer

ROOT = Path(__file__).resolve().parents[4]
EOS, FP, WIDTH = 2, "tok1-test", 64
P, Q = [5, 6, 7], [11, 12]


class Batch:
    """vLLM's persistent batch arrays, filled row by row as a test says."""

    def __init__(self, rows: int = 2):
        self.ids = np.zeros((rows, WIDTH), dtype=np.int64)
        self.num = np.zeros(rows, dtype=np.int64)

    def put(self, i: int, tokens: list[int]) -> None:
        self.ids[i] = 0
        self.ids[i, : len(tokens)] = tokens
        self.num[i] = len(tokens)

    def step(self, d: TreeDrafts, sampled: list[list[int]]) -> list[list[int]]:
        """One engine step over the first len(sampled) rows (each row already holds its tokens)."""
        return d.propose(sampled, self.num[: len(sampled)].copy(), self.ids[: len(sampled)].copy())


def drafts(store=None, **kw) -> TreeDrafts:
    settings = ProposerSettings(None, None, [EOS], adaptive=False, shared=False, fingerprint=FP)
    return TreeDrafts(settings, budget=4, max_model_len=WIDTH - 4, link=StoreLink(store) if store is not None else None, **kw)


def stored(path: Path) -> dict[str, list[tuple[int, ...]]]:
    with LmdbSequenceStore.open(path) as s:
        return {u: sorted(tuple(x.tokens) for x in s.read(u)) for u in s.uids()}


def generate(b: Batch, d: TreeDrafts, i: int, prompt: list[int], out: list[int]) -> list[list[int]]:
    """Row i takes `prompt` and keeps `out` one token a step (alone in the batch)."""
    drafts_seen = []
    for j in range(1, len(out) + 1):
        b.put(i, prompt + out[:j])
        drafts_seen.append(b.step(d, [[]] * i + [[out[j - 1]]])[i])
    return drafts_seen


def test_rows_with_one_prompt_share_one_tree_also_after_the_first_ended(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d, b = drafts(store), Batch()
        generate(b, d, 0, P, [30, 31, 32, 33, EOS])
        b.put(0, P + [30])  # a later request of the same prompt, in the same row
        assert b.step(d, [[30]]) == [[31, 32, 33, EOS]]  # the first sample's tokens, not yet committed
        b.put(1, Q + [30])  # another prompt's tree knows nothing after 30
        assert b.step(d, [[], [30]])[1] == []
        counts = d.finish()
    assert counts["groups"] == 2 and counts["hits"] == 0
    assert stored(tmp_path / "c")[prompt_uid(P, FP)] == [(7, 30), (7, 30, 31, 32, 33, EOS)]


def test_a_request_out_of_the_batch_comes_back_as_itself_and_a_longer_row_is_a_new_prompt(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d, b = drafts(store), Batch()
        generate(b, d, 0, P, [30, 31])
        b.put(0, Q + [40])
        b.step(d, [[40]])  # preempted: another request has the row
        b.put(0, P + [30, 31, 50, 51, 52])  # the next chat turn: starts with it, holds more
        b.put(1, P + [30, 31, 32])  # back, recomputed, with one more token
        b.step(d, [[52], [32]])
        assert d.tracker.rows[0].uid == prompt_uid(P + [30, 31, 50, 51], FP)
        assert d.c.resumed_rows == 1 and d.tracker.rows[1].uid == prompt_uid(P, FP)
        d.finish()
    assert stored(tmp_path / "c")[prompt_uid(P, FP)] == [(7, 30, 31, 32)]  # one sequence, not two


def test_a_request_back_after_an_idle_commit_goes_on_as_itself(tmp_path):
    """A stalled step looks idle: the commit stores the sequences, and a row vLLM skipped that
    comes back afterwards is still the same sequence, not a second copy of its tokens."""
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d, b = drafts(store, commit_seconds=0.01), Batch()
        generate(b, d, 0, P, [30, 31])
        b.put(0, Q + [40])
        b.step(d, [[40]])  # skipped: another request has the row
        time.sleep(d.clock.idle_after(0.01))
        d.commit_if_idle()
        assert stored(tmp_path / "c")[prompt_uid(P, FP)] == [(7, 30, 31)]
        b.put(1, P + [30, 31, 32])  # back, with one more token
        b.step(d, [[40], [32]])
        assert d.c.resumed_rows == 1 and d.tracker.rows[1].uid == prompt_uid(P, FP)
        assert d.session.trees.groups[prompt_uid(P, FP)].tree.sequences == 1
        d.finish()
    assert prompt_uid(P + [30, 31], FP) not in stored(tmp_path / "c")
    assert stored(tmp_path / "c")[prompt_uid(P, FP)] == [(7, 30, 31)]


def test_a_request_away_for_longer_than_park_steps_is_ended_and_returns_as_a_new_prompt(tmp_path):
    d, b = drafts(), Batch()
    generate(b, d, 0, P, [30, 31])
    first = d.tracker.rows[0]
    for _ in range(row_tracking.PARK_STEPS + 1):  # it left at the first of these steps
        b.put(0, Q + [40])
        b.step(d, [[]])  # another request prefilling there
    assert not first.ended  # still PARK_STEPS steps away: it could come back
    b.step(d, [[]])
    assert first.ended and not d.tracker.away
    b.put(0, P + [30, 31, 32])
    b.step(d, [[32]])
    assert d.c.resumed_rows == 0 and d.tracker.rows[0].uid == prompt_uid(P + [30, 31], FP)


def test_sequences_are_committed_in_batches_as_they_end_without_a_finish(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d, b = drafts(store, commit_every=2, commit_seconds=3600), Batch()
        generate(b, d, 0, P, [30, EOS])
        assert d.session.waiting == 1 and stored(tmp_path / "c") == {}
        generate(b, d, 0, Q, [31, EOS])  # the second ended sequence: one append of both
        assert d.c.commits == 1 and set(stored(tmp_path / "c")) == {prompt_uid(P, FP), prompt_uid(Q, FP)}
        d2, b2 = drafts(store, commit_every=100, commit_seconds=0.01), Batch()
        generate(b2, d2, 0, P, [32, EOS])
        time.sleep(0.02)
        b2.put(0, Q + [33])
        b2.step(d2, [[33]])  # the oldest waiting sequence is older than commit_seconds
        assert len(stored(tmp_path / "c")[prompt_uid(P, FP)]) == 2
        d2.commit_if_idle(3600)  # not idle yet: nothing ends
        assert len(stored(tmp_path / "c")[prompt_uid(Q, FP)]) == 1
        time.sleep(d2.clock.idle_after(0.0))
        d2.commit_if_idle(0.0)  # idle: the row that was still generating ends and is appended
        assert (12, 33) in stored(tmp_path / "c")[prompt_uid(Q, FP)]


def test_idle_means_longer_without_a_step_when_vllms_steps_are_slow(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d, b = drafts(store, commit_seconds=0.01), Batch()
        b.put(0, P + [30])
        b.step(d, [[30]])
        for t in (31, 32):
            time.sleep(0.05)  # slow steps: 50 ms apart
            b.put(0, P + [30, 31, 32][: t - 29])
            b.step(d, [[t]])
        assert d.clock.idle_after(0.01) >= 0.15
        time.sleep(0.02)
        d.commit_if_idle()  # 20 ms after a step, but its steps take 50: not idle
        assert not d.tracker.rows[0].ended
        time.sleep(d.clock.idle_after(0.01))
        d.commit_if_idle()
        assert d.tracker.rows[0].ended and stored(tmp_path / "c") == {prompt_uid(P, FP): [(7, 30, 31, 32)]}


def test_a_prompt_back_after_its_tree_left_memory_has_its_sequences_appended_first_and_loads_as_a_hit(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        d, b = drafts(store, commit_every=100, commit_seconds=3600, idle_groups=1), Batch()
        generate(b, d, 0, P, [30, 31, EOS])
        generate(b, d, 0, Q, [40, EOS])  # P's tree is no longer among the idle ones kept
        assert prompt_uid(P, FP) not in d.session.trees.groups and stored(tmp_path / "c") == {}
        b.put(0, P + [30])
        assert b.step(d, [[30]]) == [[31, EOS]]  # drafted from the reloaded tree
        assert d.finish()["hits"] == 1


def test_a_failed_append_is_logged_and_vllm_steps_on(tmp_path, caplog):
    store = LmdbSequenceStore.open(tmp_path / "c")
    d, b = drafts(store, commit_every=1), Batch()
    store.close()
    with caplog.at_level(logging.ERROR, logger="srt.vllm"):
        generate(b, d, 0, P, [30, EOS])
        b.put(0, Q + [31])
        assert b.step(d, [[31]]) == [[]]
    assert "cannot load prompt" in caplog.text and "cannot append 1 sequences" in caplog.text


def _tokenizer_dir(tmp_path: Path) -> Path:
    """A directory with the bundled tokenizer only (vLLM's `--tokenizer` may name such a one)."""
    from srtcli.tiny_model import copy_bundled_tokenizer

    (tmp_path / "m").mkdir()
    return copy_bundled_tokenizer(tmp_path / "m")


def test_the_worker_fingerprints_the_tokenizer_as_srt_rollout_does(tmp_path):
    from srtcli.models import load_tokenizer
    from srtcli.tokenizers import tokenizer_fingerprint

    from srtcli.models import default_model_dir

    tok = load_tokenizer(default_model_dir())  # as srt rollout loads --model
    facts = facts_of(load_worker_tokenizer(str(_tokenizer_dir(tmp_path))), [2], "cuda")
    assert facts.fingerprint == tokenizer_fingerprint(tok)
    assert facts.eos_ids == sorted({tok.eos_token_id, 2})
    t = completed(ProposerSettings(), facts)
    assert (t.fingerprint, t.eos_ids, t.adaptive) == (facts.fingerprint, facts.eos_ids, False)
    assert completed(ProposerSettings(), ModelFacts("fp", [2], "cpu")).adaptive is True  # as srt rollout's default
    assert completed(ProposerSettings(eos_ids=[9], adaptive=False), ModelFacts("fp", [2], "cpu")).eos_ids == [9]


def test_commit_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SRT_VLLM_COMMIT_EVERY", "3")
    monkeypatch.setenv("SRT_VLLM_COMMIT_SECONDS", "0.5")
    assert commit_settings() == (3, 0.5)
    monkeypatch.setenv("SRT_VLLM_COMMIT_EVERY", "many")
    with pytest.raises(SrtError) as e:
        commit_settings()
    assert "SRT_VLLM_COMMIT_EVERY" in e.value.message and "\n" not in e.value.message


# the proposer as vLLM builds it (the config: only the fields it reads), in a process of its
# own that then exits or is killed
_CONFIG = """
import sys, types, numpy as np
from srtcli.rollout.vllm.proposer import SrtProposer
ns = types.SimpleNamespace
cfg = ns(speculative_config=ns(num_speculative_tokens=4), model_config=ns(max_model_len=60, tokenizer=sys.argv[1],
         tokenizer_revision=None, trust_remote_code=False), device_config=ns(device_type="cpu"),
         parallel_config=ns(worker_extension_cls=""), scheduler_config=ns(max_num_seqs=8))
"""
_WORKER = _CONFIG + """
p = SrtProposer(cfg)
ids = np.zeros((1, 64), dtype=np.int64)
ids[0, :5] = [5, 6, 7, 30, 2]  # one request: prompt 5 6 7, then 30 and eos
p.propose([[30, 2]], np.array([5]), ids)
print("ready", flush=True)
if sys.argv[2] == "kill":
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_the_proposer_commits_at_process_exit_and_a_killed_one_leaves_a_sound_cache(tmp_path, end):
    model = _tokenizer_dir(tmp_path)
    env = {**os.environ, "SRT_CACHE": str(tmp_path / "c"), "SRT_VLLM_COMMIT_SECONDS": "3600",
           "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _WORKER, str(model), end], env=env, capture_output=True,
                       text=True, timeout=120)
    assert "ready" in r.stdout, r.stderr[-2000:]
    with LmdbSequenceStore.open(tmp_path / "c") as s:  # created by the proposer, readable either way
        got = {u: [tuple(x.tokens) for x in s.read(u)] for u in s.uids()}
    if end == "exit":
        assert r.returncode == 0 and list(got.values()) == [[(7, 30, 2)]]
    else:  # the waiting sequence is lost, nothing else
        assert r.returncode == -9 and got == {}


def test_a_cache_the_proposer_cannot_open_stops_it_at_start_up_in_one_line(tmp_path):
    (tmp_path / "not-a-cache").write_text("a file")
    env = {**os.environ, "SRT_CACHE": str(tmp_path / "not-a-cache"), "PYTHONPATH": str(ROOT)}
    code = _CONFIG + """
from srtcli.errors import SrtError
try:
    SrtProposer(cfg)
except SrtError as e:
    print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code, str(_tokenizer_dir(tmp_path))], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.startswith("refused: ") and "not-a-cache" in r.stdout and r.stdout.count("\n") == 1, r.stderr
    assert (tmp_path / "not-a-cache").read_text() == "a file"


def test_srt_rollout_refuses_a_worker_that_fingerprints_the_tokenizer_otherwise(tmp_path):
    from srtcli.rollout.vllm.engine import check_fingerprint

    check_fingerprint("tok1-a", "tok1-a", tmp_path)
    with pytest.raises(SrtError) as e:
        check_fingerprint("tok1-a", "tok1-b", tmp_path)
    assert "cache uids would differ" in e.value.message and "\n" not in e.value.message


def test_a_drivers_batch_end_finishes_what_the_proposer_never_saw_of_its_requests(tmp_path):
    """vLLM does not always hand the proposer a request's last step: the driver's `srt_finish`
    passes how each request ended, and its stored copy is whole (two identical requests are
    each taken once; without the ends, the copies stop where the proposer last saw them)."""
    for ends in (True, False):
        path = tmp_path / f"c-{ends}"
        with LmdbSequenceStore.open(path) as store:
            d, b = drafts(store), Batch()
            for row in (0, 1):
                b.put(row, P)
            for tok in (30, 31):  # both rows alike; then their last step goes unseen
                for row in (0, 1):
                    b.put(row, b.ids[row, : b.num[row]].tolist() + [tok])
                b.step(d, [[tok], [tok]])
            uid, whole = prompt_uid(P, FP), P + [30, 31, 32, 33, EOS, 0, 0]  # what vLLM kept past eos is not stored
            d.finish([(uid, len(whole), whole)] * 2 if ends else None)  # short: its last tokens are all of it
        want = [(7, 30, 31, 32, 33, EOS)] * 2 if ends else [(7, 30, 31)] * 2
        assert stored(path)[uid] == want
