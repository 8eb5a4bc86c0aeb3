"""The sequence store on a real redis-server: its key layout (one hash slot per command), real
writer processes (concurrent, SIGKILLed, racing a prune), LMDB -> server -> LMDB copies, and
every way the server can fail (unreachable, lost, refusing the password, TLS), always in one
line naming the URL with its password masked."""

from __future__ import annotations

import multiprocessing
import random
import signal
import time
from collections import Counter

import pytest
import redis
from redis.crc import key_slot

from cache_store import seqrecord
from cache_store.errors import CacheError, CacheUnavailable, FormatVersionError, NotACacheError
from cache_store.locations import export_store, import_store
from cache_store.redis_store import RedisSequenceStore, mask_url
from cache_store.seqprune import PruneCriteria
from cache_store.seqstore import LmdbSequenceStore
from cache_store.uid import prompt_uid
from tests.cache_store.redis_server import BINARY, NO_SERVER, RedisServer, free_port, start_tls, unique_prefix

UIDS = [prompt_uid([k], "redis") for k in range(4)]
FORK = multiprocessing.get_context("fork")


def rollout(i: int, n: int = 30) -> list[int]:
    r = random.Random(i)
    return [r.randrange(50) for _ in range(n)]


def raw_client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port)


def sound(url: str, server: RedisServer) -> dict[str, Counter]:
    """Every prompt's sequences (a multiset), after checking what a crash or a race could break:
    every record decodes, every index entry and meta count matches the records, and every
    prompt with records is listed."""
    prefix = url.split("prefix=")[1]
    r = raw_client(server)
    with RedisSequenceStore.open(url) as s:
        listed, out = s.uids(), {}
        for key in r.scan_iter(match=f"{prefix}:{{*}}:meta"):
            uid = key.decode().split("{")[1].split("}")[0]
            recs = {int(n): v for n, v in r.hgetall(f"{prefix}:{{{uid}}}:seqs").items()}
            heads = {n: seqrecord.check(v) for n, v in recs.items()}  # raises if any is torn
            meta = {k.decode(): v for k, v in r.hgetall(key).items()}
            assert int(meta["seqs"]) == len(recs) and int(meta["bytes"]) == sum(map(len, recs.values()))
            assert int(meta["tokens"]) == sum(h.tokens for h in heads.values())
            assert int(meta["next"]) > max(recs)
            idx = r.zrange(f"{prefix}:{{{uid}}}:idx", 0, -1, withscores=True)
            assert sorted(int(sc) for _, sc in idx) == sorted(recs) and uid in listed
            out[uid] = Counter(tuple(x.tokens.tolist()) for x in s.read(uid))
        assert sorted(out) == listed
    return out


# -- layout and round trips ------------------------------------------------------------------

def test_every_key_of_a_prompt_shares_its_slot_and_the_global_keys_theirs(redis_server):
    prefix = unique_prefix()
    with RedisSequenceStore.open(redis_server.url(prefix)) as s:
        s.append_many({u: [rollout(k)] for k, u in enumerate(UIDS)})
        s.tick()
        s.prune(PruneCriteria(max_prompts=3))
    keys = sorted(k.decode() for k in raw_client(redis_server).scan_iter(match=f"*{prefix}*"))
    glob = [k for k in keys if k.startswith(f"{{{prefix}}}:")]
    assert glob == [f"{{{prefix}}}:{n}" for n in ("clock", "info", "prompts")]
    assert len({key_slot(k.encode()) for k in glob}) == 1
    per_prompt = [k for k in keys if k not in glob]
    assert len(per_prompt) == 3 * 3
    for k in per_prompt:
        p, tagged, name = k.split(":")
        uid = tagged.strip("{}")
        assert p == prefix and tagged == f"{{{uid}}}" and uid in UIDS and name in ("seqs", "idx", "meta")
        assert key_slot(k.encode()) == key_slot(f"{{{uid}}}".encode())


def test_a_bounded_read_is_two_round_trips_and_so_is_an_append(redis_url):
    """A load reads the clock and a page of the index, then only the records it keeps (with
    the one that ends the walk), whatever the prompt has stored."""
    with RedisSequenceStore.open(redis_url) as s:
        s.append(UIDS[0], [rollout(i) for i in range(50)])
        s.append_many({UIDS[1]: [[1]]})  # the server has the scripts now
        sent = []
        real = s._send
        s._send = lambda commands: sent.append(commands) or real(commands)
        assert len(s.read(UIDS[0], newest=4, tokens=100)) == 3
        assert len(sent) == 2
        assert sent[1][0][0] == "HMGET" and len(sent[1][0]) == 2 + 4  # the 3 newest fit 100 tokens, the 4th ends it
        s.append_many({u: [rollout(1), rollout(2)] for u in UIDS})
        assert len(sent) == 4  # the clock, then every prompt's script in one pipeline


def test_a_server_that_lost_its_scripts_gets_them_again(redis_url, redis_server):
    with RedisSequenceStore.open(redis_url) as s:
        s.append(UIDS[0], [rollout(0)])
        raw_client(redis_server).script_flush()
        s.append(UIDS[0], [rollout(1)])
        assert len(s.read(UIDS[0], newest=5)) == 2


# -- real processes ----------------------------------------------------------------------------

def _writer(url: str, w: int, batches: int, go) -> None:  # noqa: ANN001 - an Event
    with RedisSequenceStore.open(url) as s:
        go.wait()
        for b in range(batches):
            s.append_many({UIDS[(w + b + k) % 4]: [[w, b, k, j, *rollout(w * 10**4 + b * 10 + k)] for j in range(2)]
                           for k in range(2)})


def test_eight_concurrent_writers_lose_nothing_and_duplicate_nothing(redis_url, redis_server):
    RedisSequenceStore.open(redis_url).close()
    go = FORK.Event()
    procs = [FORK.Process(target=_writer, args=(redis_url, w, 150, go)) for w in range(8)]
    for p in procs:
        p.start()
    go.set()  # all at once, so their appends interleave
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    want = {u: Counter() for u in UIDS}
    for w in range(8):
        for b in range(150):
            for k in range(2):
                for j in range(2):
                    want[UIDS[(w + b + k) % 4]][(w, b, k, j, *rollout(w * 10**4 + b * 10 + k))] += 1
    assert sound(redis_url, redis_server) == want


def _endless_writer(url: str, round_: int, w: int) -> None:
    with RedisSequenceStore.open(url) as s:
        for b in range(10**9):  # long sequences: a kill often lands while a pipeline is being sent
            s.append_many({u: [[round_, w, b, j, *rollout(b, 3000)] for j in range(3)] for u in UIDS[:3]})


def test_a_writer_killed_mid_batch_leaves_no_partial_record(redis_url, redis_server):
    """Writers SIGKILLed at random moments: every record whole, every meta and index in step with
    its records, and each prompt's append (3 sequences) entirely there or not at all."""
    RedisSequenceStore.open(redis_url).close()
    rng = random.Random(3)
    for round_ in range(6):
        procs = [FORK.Process(target=_endless_writer, args=(redis_url, round_, w)) for w in range(2)]
        for p in procs:
            p.start()
        time.sleep(rng.uniform(0.2, 0.5))
        for p in procs:
            p.kill()
            p.join()
        assert [p.exitcode for p in procs] == [-signal.SIGKILL] * 2
    got = sound(redis_url, redis_server)
    for counts in got.values():
        assert set(Counter(seq[:3] for seq in counts.elements()).values()) == {3}  # each append whole
    assert sum(sum(c.values()) for c in got.values()) > 6 * 2 * 3


def _appender(url: str, w: int, n: int, go) -> None:  # noqa: ANN001 - an Event
    with RedisSequenceStore.open(url) as s:
        go.wait()
        for i in range(n):
            s.append_many({UIDS[i % 3]: [rollout(w * 1000 + i)]})


def test_a_prune_racing_appenders_removes_only_what_it_planned(redis_url, redis_server):
    """Light sequences (weight 0.25) go into the prompts two writer processes append to, and are
    pruned again with min_count 0.5, over and over: every append survives, every light one goes,
    and the metas stay in step (a prune deleting a whole prompt would lose appends)."""
    s = RedisSequenceStore.open(redis_url, half_life=1.0)
    go = FORK.Event()
    procs = [FORK.Process(target=_appender, args=(redis_url, w, 300, go)) for w in range(2)]
    for p in procs:
        p.start()
    go.set()
    light = removed = 0
    while any(p.is_alive() for p in procs) or not light:
        s.append_raw({u: [seqrecord.encode(seqrecord.as_tokens(rollout(-1 - k)), s.now(), 0.25)]
                      for k, u in enumerate(UIDS[:3])})
        light += 3
        removed += s.prune(PruneCriteria(min_count=0.5)).sequences
    for p in procs:
        p.join()
    removed += s.prune(PruneCriteria(min_count=0.5)).sequences
    s.close()
    assert [p.exitcode for p in procs] == [0, 0] and removed == light
    assert light > 30  # many prunes ran during the appends
    want = {u: Counter() for u in UIDS[:3]}
    for w in range(2):
        for i in range(300):
            want[UIDS[i % 3]][tuple(rollout(w * 1000 + i))] += 1
    assert sound(redis_url, redis_server) == want


def test_an_eviction_racing_appenders_keeps_every_append_it_did_not_plan(redis_url, redis_server):
    """Prunes that evict every prompt they see, while writers append: what remains is exactly
    what was written less what the plans removed."""
    s = RedisSequenceStore.open(redis_url)
    go = FORK.Event()
    procs = [FORK.Process(target=_appender, args=(redis_url, w, 300, go)) for w in range(2)]
    for p in procs:
        p.start()
    go.set()
    removed = prunes = 0
    while any(p.is_alive() for p in procs):
        removed += s.prune(PruneCriteria(max_prompts=0)).sequences
        prunes += 1
    for p in procs:
        p.join()
    s.close()
    left = sound(redis_url, redis_server)
    assert sum(sum(c.values()) for c in left.values()) == 600 - removed and prunes > 10 and removed > 0


# -- copies between backends -------------------------------------------------------------------

def test_lmdb_to_server_to_lmdb_is_byte_exact(tmp_path, redis_url):
    src = LmdbSequenceStore.open(tmp_path / "src", half_life=3.0, floor=0.05)
    src.append_many({u: [rollout(10 * k + j, 5 + j) for j in range(k + 1)] for k, u in enumerate(UIDS)},
                    probs={UIDS[1]: [[0.5] * 5, None]})
    src.tick(4)
    src.append(UIDS[0], [rollout(99)])
    key, rec = src.raw_records(UIDS[2])[0]
    src.put_raw(key, rec[:-1] + bytes([rec[-1] ^ 1]))  # a corrupt record travels as it is
    src.prune(PruneCriteria(max_prompts=3))  # a gap in the uids
    server = RedisSequenceStore.open(redis_url)
    rep = export_store(src, server)
    assert rep == sum(len(v) for u in src.uids() for _, v in src.raw_records(u))
    assert export_store(server, tmp_path / "back") > 0
    back = LmdbSequenceStore.open(tmp_path / "back")
    assert back.uids() == server.uids() == src.uids() and back.info() == server.info() == src.info()
    assert back.last_writes() == server.last_writes() == src.last_writes()
    for uid in UIDS:
        assert back.raw_records(uid) == server.raw_records(uid) == src.raw_records(uid)
    for s in (src, server, back):
        s.close()


def test_a_copy_refuses_a_used_directory_and_import_takes_any_backend(tmp_path, redis_url, redis_server):
    with RedisSequenceStore.open(redis_url) as s:
        s.append(UIDS[0], [rollout(0)])
        (tmp_path / "used").mkdir()
        (tmp_path / "used" / "x").write_text("mine")
        with pytest.raises(CacheError, match="not an empty directory"):
            export_store(s, tmp_path / "used")
        other = redis_server.url(unique_prefix())
        export_store(s, other)
        assert import_store(s, other).sequences == 1 and s.stats().sequences == 2
        lm = LmdbSequenceStore.open(tmp_path / "lm")
        assert import_store(lm, s).sequences == 2
        assert import_store(s, tmp_path / "lm").sequences == 2 and s.stats().sequences == 4
        with pytest.raises(CacheError, match="into itself"):
            import_store(s, redis_url)
        lm.close()


def test_a_server_has_nothing_to_compact(redis_url):
    with RedisSequenceStore.open(redis_url) as s:
        for fn in (s.compact, s.check_compactable):
            with pytest.raises(CacheError, match="nothing to compact"):
                fn()


# -- opening: header, URL, credentials, failures ------------------------------------------------

def test_the_header_refuses_foreign_keys_newer_versions_and_missing_caches(redis_server):
    r = raw_client(redis_server)
    prefix = unique_prefix()
    with pytest.raises(NotACacheError, match="no srt cache here"):
        RedisSequenceStore.open(redis_server.url(prefix), create=False)
    with pytest.raises(NotACacheError, match="no srt cache here"):
        RedisSequenceStore.open(redis_server.url(prefix), readonly=True)
    assert r.keys(f"*{prefix}*") == []  # nothing created
    r.set(f"{{{prefix}}}:info", "someone else's")
    with pytest.raises(NotACacheError, match="not an srt cache"):
        RedisSequenceStore.open(redis_server.url(prefix))
    r.delete(f"{{{prefix}}}:info")
    r.hset(f"{{{prefix}}}:info", mapping={"format": "other"})
    with pytest.raises(NotACacheError, match="not an srt cache"):
        RedisSequenceStore.open(redis_server.url(prefix))
    RedisSequenceStore.open(redis_server.url(prefix := unique_prefix())).close()
    r.hset(f"{{{prefix}}}:info", "version", "99")
    with pytest.raises(FormatVersionError, match="newer than this srt"):
        RedisSequenceStore.open(redis_server.url(prefix))


def test_a_readonly_store_refuses_writes(redis_url):
    RedisSequenceStore.open(redis_url).close()
    with RedisSequenceStore.open(redis_url, readonly=True) as s:
        for fn in (lambda: s.append(UIDS[0], [rollout(0)]), s.tick, lambda: s.prune(PruneCriteria(max_prompts=0))):
            with pytest.raises(CacheError, match="read-only"):
                fn()
        assert s.prune(dry_run=True).sequences == 0


def test_mask_url_hides_the_password_everywhere():
    assert mask_url("redis://user:s3cret@h:6379/0?prefix=x") == "redis://user:***@h:6379/0?prefix=x"
    assert mask_url("rediss://:s3cret@h:6379/1") == "rediss://:***@h:6379/1"
    assert mask_url("redis://h:6379/0?password=s3cret&prefix=x") == "redis://h:6379/0?password=***&prefix=x"
    assert "s3cret" not in mask_url("redis://u:s3c/ret@h:6379/0")  # not a URL urlsplit reads
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"
    with pytest.raises(ValueError, match="prefix"):
        RedisSequenceStore.open("redis://u:s3cret@127.0.0.1:1/0?prefix=a{b}")


def test_an_unreachable_server_is_one_line_with_the_password_masked():
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0?prefix=x"
    with pytest.raises(CacheUnavailable) as e:
        RedisSequenceStore.open(url)
    msg = str(e.value)
    assert msg.startswith("redis://user:***@127.0.0.1:") and "cannot reach the cache server" in msg
    assert "hunter2" not in msg and "\n" not in msg and "hunter2" not in repr(e.value)


def test_a_lost_server_is_cache_unavailable(tmp_path):
    if BINARY is None:
        pytest.skip(NO_SERVER)
    server = RedisServer(tmp_path).start()
    s = RedisSequenceStore.open(server.url())
    s.append(UIDS[0], [rollout(0)])
    server.stop()
    for fn in (lambda: s.read(UIDS[0]), lambda: s.append(UIDS[0], [rollout(1)]), s.tick, s.stats, s.uids):
        with pytest.raises(CacheUnavailable, match=r"^redis://127\.0\.0\.1:\d+/0\?prefix=srt: cannot reach"):
            fn()
    s.close()


def test_credentials_refused_in_one_line_and_taken_from_the_environment(tmp_path, monkeypatch):
    if BINARY is None:
        pytest.skip(NO_SERVER)
    monkeypatch.delenv("SRT_REDIS_PASSWORD", raising=False)
    with RedisServer(tmp_path, "--requirepass", "s3cret-pw") as server:
        for url in (server.url(), server.url(auth=":wrong-pw"), server.url(auth="nobody:s3cret-pw")):
            with pytest.raises(CacheError) as e:
                RedisSequenceStore.open(url)
            assert not isinstance(e.value, CacheUnavailable)
            msg = str(e.value)
            assert "refused the credentials" in msg and "\n" not in msg
            assert "s3cret-pw" not in msg and "wrong-pw" not in msg and msg.startswith(mask_url(url))
        with RedisSequenceStore.open(server.url(auth=":s3cret-pw")) as s:
            s.append(UIDS[0], [rollout(0)])
            assert "s3cret" not in repr(s) + s.path
        monkeypatch.setenv("SRT_REDIS_PASSWORD", "s3cret-pw")
        with RedisSequenceStore.open(server.url()) as s:
            assert [x.tokens.tolist() for x in s.read(UIDS[0])] == [rollout(0)]
        with pytest.raises(CacheError, match="refused the credentials"):  # the URL's own password wins
            RedisSequenceStore.open(server.url(auth=":wrong-pw"))


def test_tls_with_a_throwaway_ca(tmp_path):
    if BINARY is None:
        pytest.skip(NO_SERVER)
    server = start_tls(tmp_path)
    if isinstance(server, str):
        pytest.skip(server)
    try:
        ca = server.tls.ca
        with RedisSequenceStore.open(server.url(query=f"ssl_ca_certs={ca}")) as s:
            assert s.path.startswith("rediss://")
            s.append(UIDS[0], [rollout(0)])
            assert [x.tokens.tolist() for x in s.read(UIDS[0], newest=1)] == [rollout(0)]
        with pytest.raises(CacheUnavailable, match="cannot reach"):  # a server the default CAs do not trust
            RedisSequenceStore.open(server.url())
    finally:
        server.stop()


def test_an_append_sent_again_with_its_id_lands_once(redis_url):
    """A writer that lost the reply to an append sends it again with the same id: each prompt
    gets it once; another id is another append."""
    with RedisSequenceStore.open(redis_url) as s:
        a, b = "a" * 32, "b" * 32
        for _ in range(2):
            s.append_many({a: [[1, 2]], b: [[3]]}, append_id="first")
        s.append_many({a: [[1, 2]]}, append_id="second")
        s.append_many({a: [[1, 2]]})
        assert [list(x.tokens) for x in s.read(a)] == [[1, 2]] * 3
        assert [list(x.tokens) for x in s.read(b)] == [[3]]
