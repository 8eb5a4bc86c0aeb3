"""`srt rollout` stores with every generated token the probability the policy gave it (the
pool's `old_logprobs`), so later runs draft by it; greedy runs store none, and
`--no-draft-stop` (flag or config key; the flag wins) turns the stop off without changing what
is stored; `srt cache add` of a sampled run's pool stores the same probabilities."""

from __future__ import annotations

import math

from click.testing import CliRunner

from cache_store.seqstore import LmdbSequenceStore
from srtcli.cli import cli
from srtcli.pool import read_pool
from tests.srtcli.rollout.test_rollout import model_dir, roll, summary  # noqa: F401 - fixture

STORED = 1 / 508  # one byte per probability: within half a step of 1/254


def stored(cache) -> list[tuple[list[int], object]]:
    s = LmdbSequenceStore.open(cache)
    try:
        return [(x.tokens.tolist(), x.probs) for uid in s.uids() for x in s.read(uid)]
    finally:
        s.close()


def last_steps(pool) -> dict[str, object]:
    out = {}
    for st in read_pool(pool):
        if st.trajectory_id not in out or st.step > out[st.trajectory_id].step:
            out[st.trajectory_id] = st
    return out


def test_sampled_rollouts_store_their_tokens_probabilities(tmp_path, model_dir):
    summary(roll(tmp_path, model_dir, "-n", "4", "--max-new-tokens", "12", "--temperature", "1.0"))
    seqs = stored(tmp_path / "cache")
    steps = list(last_steps(tmp_path / "pool").values())
    assert len(seqs) == len(steps) == 16
    for st in steps:
        start = st.loss_mask.index(1)
        match = [(t, p) for t, p in seqs if t == st.input_ids[start - 1:]]  # the anchor, then the output
        assert match, st.trajectory_id
        _, probs = match[0]
        assert math.isnan(probs[0])
        for p, m, lp in zip(probs[1:], st.loss_mask[start:], st.old_logprobs[start:]):
            assert abs(p - (math.exp(lp) if m else 0.0)) <= STORED


def test_greedy_rollouts_store_no_probabilities(tmp_path, model_dir):
    summary(roll(tmp_path, model_dir, "-n", "2", "--max-new-tokens", "8", "--temperature", "0"))
    seqs = stored(tmp_path / "cache")
    assert seqs and all(p is None for _, p in seqs)


def test_no_draft_stop_from_the_flag_or_the_config_reaches_the_drafter(tmp_path, model_dir, monkeypatch):
    from srtcli.rollout.drafters.srt import SrtDrafter

    seen, init = [], SrtDrafter.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        seen.append(self.stop)

    monkeypatch.setattr(SrtDrafter, "__init__", spy)
    (tmp_path / "c.yaml").write_text("draft-stop: false\n")
    for name, args in (("default", []), ("flag", ["--no-draft-stop"]), ("config", ["--config", str(tmp_path / "c.yaml")]),
                       ("both", ["--config", str(tmp_path / "c.yaml"), "--draft-stop"])):
        out = summary(roll(tmp_path, model_dir, "-n", "2", "--max-new-tokens", "8", *args, out=f"pool-{name}",
                           cache=f"cache-{name}"))
        assert out["generated_tokens"] > 0
        assert all(p is not None for _, p in stored(tmp_path / f"cache-{name}"))  # stored either way
    assert seen == [True, False, False, True]  # the flag wins over the file


def test_cache_add_of_a_sampled_pool_stores_what_rollout_stored(tmp_path, model_dir):
    """Warming a new cache from the pool a sampled run wrote stores the same tokens with the
    same probability bytes as the run itself; from a greedy run's pool, none."""
    for t in ("1.0", "0"):
        summary(roll(tmp_path, model_dir, "-n", "3", "--max-new-tokens", "10", "--temperature", t,
                     out=f"pool{t}", cache=f"run{t}"))
        out = summary(CliRunner().invoke(cli, ["cache", "add", str(tmp_path / f"pool{t}"), "--model", str(model_dir),
                                               "--cache", str(tmp_path / f"add{t}"), "--json"]))
        ran, added = (sorted((s, None if p is None else p.tobytes()) for s, p in stored(tmp_path / f"{c}{t}"))
                      for c in ("run", "add"))
        assert ran == added and len(ran) == 12
        assert out["with_probs"] == (12 if t == "1.0" else 0)
