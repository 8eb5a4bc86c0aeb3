"""The tree cache as `srt` uses it, on a real redis-server as well as LMDB: a rollout drafts from
a shared server exactly as from a directory; a server lost mid-run stops nothing and loses no
rollout (what it never took lands in a local store that `srt cache import` adds); a server that
cannot be reached or refuses the password is one line before anything is written; the password
is never printed; LMDB on a network filesystem is refused in one line naming `redis://`."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_store.locations import import_store
from cache_store.redis_store import RedisSequenceStore
from cache_store.seqstore import LmdbSequenceStore
from srtcli.cli import cli
from srtcli.pool import read_pool
from srtcli.store_link import StoreLink
from tests.cache_store.redis_server import BINARY, NO_SERVER, RedisServer, unique_prefix

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-pw-7f2a"


def prompts(tmp_path: Path, n: int = 16) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join((ROOT / "examples/arith/prompts.jsonl").read_text().splitlines(True)[:n]))
    return p


def roll(tmp_path: Path, cache: str, out: str, *args: str) -> dict:
    """A rollout whose draft lengths depend on the seed only (the cost rule's follow timings), so
    two backends give the same pools and forwards."""
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "--cache", cache,
                                 "--out", str(tmp_path / out), "--draft-length", "adaptive", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output.strip().splitlines()[-1])


def outputs(pool: Path) -> list:
    """Every step's tokens, in a fixed order (groups are written as they finish)."""
    return sorted((s.prompt_uid, s.trajectory_id, s.step, s.input_ids) for s in read_pool(pool))


def test_a_rollout_drafts_from_a_redis_cache_as_from_a_directory(tmp_path, redis_url):
    """Two runs on each backend: the same pools and the same forwards (the second run drafts
    from what the first stored)."""
    for run in ("first", "second"):
        a = roll(tmp_path, str(tmp_path / "lmdb"), f"lmdb-{run}")
        b = roll(tmp_path, redis_url, f"redis-{run}")
        assert (a["target_forwards"], a["cache_hit_rate"]) == (b["target_forwards"], b["cache_hit_rate"])
        assert outputs(tmp_path / f"lmdb-{run}") == outputs(tmp_path / f"redis-{run}")
    assert b["cache"] == redis_url and b["cache_hit_rate"] == 1.0


class Flaky:
    """A store whose server goes away and comes back: every call fails while `down`."""

    def __init__(self, store):
        self.store, self.down, self.path = store, False, store.path

    def __getattr__(self, name):
        from cache_store.errors import CacheUnavailable

        def call(*a, **kw):
            if self.down:
                raise CacheUnavailable(f"{self.path}: cannot reach the cache server (gone)")
            return getattr(self.store, name)(*a, **kw)
        return call


def test_a_lost_server_keeps_what_waits_and_retries_with_backoff(tmp_path, redis_url, caplog, monkeypatch):
    monkeypatch.setattr("srtcli.store_link.RETRY_FIRST", 0.05)
    store = RedisSequenceStore.open(redis_url)
    flaky = Flaky(store)
    cache = StoreLink(flaky, spill_dir=tmp_path)
    uid = "a" * 32
    flaky.down = True
    with caplog.at_level(logging.WARNING, logger="srt"):
        cache.queue(uid, [[1, 2, 3]], None)
        assert cache.append() is False and cache.stored(uid) == []
        cache.tick()
        cache.queue(uid, [[4, 5]], None)
        assert cache.append() is False  # not due yet: no second try, no second warning
    assert len([r for r in caplog.records if "cannot reach" in r.getMessage()]) == 1
    flaky.down = False
    time.sleep(0.2)
    assert cache.append() is True
    assert [list(s.tokens) for s in store.read(uid)] == [[1, 2, 3], [4, 5]]
    cache.tick()
    assert store.now() == 2  # the tick the server missed is not lost either
    cache.close()


def test_what_a_lost_server_never_takes_lands_in_a_store_srt_cache_import_adds(tmp_path, redis_url, caplog,
                                                                              monkeypatch):
    monkeypatch.setattr("srtcli.store_link.CLOSE_RETRIES", (0.01,))
    store = RedisSequenceStore.open(redis_url)
    flaky = Flaky(store)
    cache = StoreLink(flaky, spill_dir=tmp_path)
    flaky.down = True
    for i, uid in enumerate(("a" * 32, "b" * 32)):
        cache.queue(uid, [[7, i, i]], [[0.5, 0.25, 0.125]])
    with caplog.at_level(logging.WARNING, logger="srt"):
        cache.close()
    [spill] = list(tmp_path.glob("srt-unsent-*"))
    [line] = [r.getMessage() for r in caplog.records if str(spill) in r.getMessage()]
    assert "2 sequences of 2 prompts" in line and "srt cache import" in line
    r = CliRunner().invoke(cli, ["cache", "import", str(spill), "--cache", redis_url, "--json"])
    assert r.exit_code == 0, r.output
    assert [list(s.tokens) for s in store.read("b" * 32)] == [[7, 1, 1]]
    assert store.read("a" * 32)[0].probs is not None


@pytest.mark.skipif(BINARY is None, reason=NO_SERVER)
def test_a_server_killed_mid_rollout_stops_nothing_and_loses_no_rollout(tmp_path):
    """A greedy rollout in 8 rollout batches; the server is SIGKILLed once the pool has a group.
    The run ends normally with the pool plain greedy decoding gives; the sequences the server
    took before it died (its append-only file) and the local store the run left hold every
    sample; one warning line names that store."""
    server = RedisServer(tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "always").start()
    url = server.url(unique_prefix())
    p = prompts(tmp_path)
    base = [sys.executable, "-m", "srtcli", "rollout", "--prompts", str(p), "--temperature", "0", "-n", "4",
            "--rollout-batch", "2", "--json"]
    proc = subprocess.Popen([*base, "--cache", url, "--out", str(tmp_path / "pool")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    pool_file = tmp_path / "pool" / "rollout.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (pool_file.exists() and pool_file.read_text().count("\n") >= 4):
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    plain = subprocess.run([*base, "--draft", "none", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "plain")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert outputs(tmp_path / "pool") == outputs(tmp_path / "plain")
    [spill] = list((tmp_path / "pool").glob("srt-unsent-*"))
    warnings = [ln for ln in err.splitlines() if ln.startswith("srt:")]
    assert any("cannot reach" in ln for ln in warnings) and any(str(spill) in ln for ln in warnings), err
    _restart(server)
    try:
        with RedisSequenceStore.open(url) as store:
            import_store(store, str(spill))
            kept = {u: sorted(tuple(s.tokens) for s in store.read(u)) for u in store.uids()}
    finally:
        server.stop()
    assert len(kept) == 16 and all(len(v) >= 4 for v in kept.values())  # at least once: none lost
    stored = {tuple(map(int, t)) for v in kept.values() for t in v}
    first, last = {}, {}
    for s in read_pool(tmp_path / "pool"):  # a trajectory's last step holds all of it, its first the prompt
        if s.step == 0:
            first[s.trajectory_id] = s.loss_mask.index(1)
        if s.step >= last.get(s.trajectory_id, s).step:
            last[s.trajectory_id] = s
    for t, s in last.items():  # each sample's response, after the prompt's last token (the anchor), is stored
        assert tuple(s.input_ids[first[t] - 1:]) in stored


def _restart(server: RedisServer) -> None:
    """The killed server started again on its port and data (its append-only file)."""
    server.proc = subprocess.Popen([BINARY, "--port", str(server.port), "--bind", "127.0.0.1", "--appendonly", "yes",
                                    "--dir", str(server.dir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    assert server._wait(), "redis-server did not restart"


def one_line_error(r, *fragments: str) -> str:
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_a_server_that_cannot_be_reached_is_one_line_and_nothing_is_written(tmp_path):
    url = f"redis://user:{PASSWORD}@127.0.0.1:1/0"
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path)), "--cache", url,
                                 "--out", str(tmp_path / "pool")])
    line = one_line_error(r, "redis://user:***@127.0.0.1:1/0", "cannot reach")
    assert PASSWORD not in line and not (tmp_path / "pool").exists()
    LmdbSequenceStore.open(tmp_path / "y").close()  # a cache to import
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text('{"prompt_ids": [1, 2], "response_ids": [3, 4]}\n')
    for args in (["stats"], ["prune", "--max-trees", "1", "--yes"], ["export", str(tmp_path / "x")],
                 ["import", str(tmp_path / "y")], ["add", str(rollouts), "--tokenizer-fingerprint", "fp"]):
        one_line_error(CliRunner().invoke(cli, ["cache", *args, "--cache", url]), "redis://user:***@", "cannot reach")
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(BINARY is None, reason=NO_SERVER)
def test_the_password_is_never_printed_and_a_refused_one_is_one_line(tmp_path, monkeypatch):
    with RedisServer(tmp_path / "redis", "--requirepass", PASSWORD) as server:
        prefix = unique_prefix()
        url = server.url(prefix, auth=f":{PASSWORD}")
        one_line_error(CliRunner().invoke(cli, ["cache", "stats", "--cache", server.url(prefix, auth=":wrong")]),
                       "redis://:***@")
        outs = [roll(tmp_path, url, "pool"), roll(tmp_path, url, "pool2")]
        runner = CliRunner()
        outs += [runner.invoke(cli, ["cache", *args, "--cache", url]).output for args in (
            ["stats"], ["stats", "--json"], ["prune", "--max-trees", "8", "--dry-run", "--json"],
            ["export", str(tmp_path / "exported"), "--json"], ["import", str(tmp_path / "exported")])]
        monkeypatch.setenv("SRT_REDIS_PASSWORD", PASSWORD)  # the other way to give it
        outs.append(runner.invoke(cli, ["cache", "stats", "--cache", server.url(prefix)]).output)
        assert "sequences" in outs[-1]
    written = [json.dumps(o) if isinstance(o, dict) else o for o in outs]
    written += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".log"]
    assert not any(PASSWORD in w for w in written)


def test_a_cache_moves_between_lmdb_and_a_server_record_for_record(tmp_path, redis_url):
    roll(tmp_path, str(tmp_path / "lmdb"), "pool")
    runner = CliRunner()
    assert runner.invoke(cli, ["cache", "export", redis_url, "--cache", str(tmp_path / "lmdb")]).exit_code == 0
    r = runner.invoke(cli, ["cache", "export", str(tmp_path / "back"), "--cache", redis_url, "--json"])
    assert r.exit_code == 0, r.output
    with LmdbSequenceStore.open(tmp_path / "lmdb", create=False) as a, \
            LmdbSequenceStore.open(tmp_path / "back", create=False) as b:
        assert a.uids() == b.uids() and a.now() == b.now()
        assert all(a.raw_records(u) == b.raw_records(u) for u in a.uids())


def test_srt_cache_names_a_server_in_srt_cache_too(tmp_path, redis_url, monkeypatch):
    monkeypatch.setenv("SRT_CACHE", redis_url)
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path, 4)), "--out", str(tmp_path / "p"),
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["cache"] == redis_url
    assert len(RedisSequenceStore.open(redis_url).uids()) == 4


def test_lmdb_on_a_network_filesystem_is_refused_in_one_line_naming_redis(tmp_path, monkeypatch):
    """A tmpfs directory stands in for NFS (no network mount can be made here): its
    filesystem's magic number is added to the refused ones."""
    from cache_store.fs_check import fs_magic

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm (tmpfs) on this machine")
    d = shm / f"srt-test-{os.getpid()}"
    monkeypatch.setenv("SRT_REFUSE_FS_MAGIC", hex(fs_magic(shm)))
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts(tmp_path, 2)), "--cache", str(d),
                                 "--out", str(tmp_path / "p")])
    one_line_error(r, str(d), "redis://")
    assert not d.exists() and not (tmp_path / "p").exists()


def test_the_vllm_proposer_keeps_drafting_while_its_server_is_gone(tmp_path, redis_url, monkeypatch):
    """The proposer's drafting (TreeDrafts, as in vLLM's worker) over a server that goes away:
    every step still drafts from the trees in memory, and what ended meanwhile is appended once
    the server answers again."""
    from tests.srtcli.rollout.vllm.test_vllm_server_drafts import EOS, FP, P, WIDTH, Batch, generate
    from srtcli.rollout.vllm.settings import ProposerSettings
    from srtcli.rollout.vllm.tree_drafts import TreeDrafts
    from cache_store.uid import prompt_uid

    monkeypatch.setattr("srtcli.store_link.RETRY_FIRST", 0.05)
    store = RedisSequenceStore.open(redis_url)
    flaky = Flaky(store)
    settings = ProposerSettings(None, None, [EOS], adaptive=False, shared=False, fingerprint=FP)
    d, b = TreeDrafts(settings, budget=4, max_model_len=WIDTH - 4, link=StoreLink(flaky)), Batch()
    flaky.down = True
    generate(b, d, 0, P, [30, 31, 32, EOS])
    b.put(0, P + [30])  # the same prompt again: its tree (in memory) drafts the first sample
    assert b.step(d, [[30]]) == [[31, 32, EOS]]
    d.finish()
    assert store.uids() == []
    flaky.down = False
    time.sleep(0.2)
    d.finish()  # the next append takes what waited
    assert sorted(tuple(s.tokens) for s in store.read(prompt_uid(P, FP))) == [(7, 30), (7, 30, 31, 32, EOS)]


def test_an_append_whose_reply_was_lost_is_not_stored_twice(tmp_path, redis_url, monkeypatch):
    """The server takes an append, then the connection drops before its reply: the cache sends
    it again when the server answers, with the same id, and each sequence is stored once."""
    from cache_store.errors import CacheUnavailable

    monkeypatch.setattr("srtcli.store_link.RETRY_FIRST", 0.05)
    store = RedisSequenceStore.open(redis_url)

    class ReplyLost(Flaky):
        def __getattr__(self, name):
            if name == "append_many" and self.down:
                def landed_unseen(*a, **kw):
                    self.store.append_many(*a, **kw)
                    raise CacheUnavailable(f"{self.path}: the connection dropped")
                return landed_unseen
            return super().__getattr__(name)

    flaky = ReplyLost(store)
    cache = StoreLink(flaky, spill_dir=tmp_path)
    flaky.down = True
    cache.queue("a" * 32, [[1, 2, 3]], None)
    assert cache.append() is False
    flaky.down = False
    time.sleep(0.2)
    cache.queue("a" * 32, [[4]], None)
    assert cache.append() is True
    assert sorted(list(s.tokens) for s in store.read("a" * 32)) == [[1, 2, 3], [4]]


def test_a_server_in_srt_cache_stays_a_url(monkeypatch, tmp_path):
    """`$SRT_CACHE` names a server for every user of the default, the drop-in speculator too
    (a Path would fold `redis://` into `redis:/` and make a directory of it)."""
    from srtcli.store_link import cache_location

    url = "redis://127.0.0.1:6379/0?prefix=x"
    monkeypatch.setenv("SRT_CACHE", url)
    assert cache_location(None) == url and cache_location(str(tmp_path)) == tmp_path
    monkeypatch.setenv("SRT_CACHE", str(tmp_path / "c"))
    assert cache_location(None) == tmp_path / "c"
