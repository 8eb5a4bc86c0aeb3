"""The sequence store on a Redis (or Valkey) server that every machine of a run shares.

`RedisSequenceStore` keeps exactly what `LmdbSequenceStore` (cache_store.seqstore) keeps, with
the same semantics, behind the same interface (cache_store.store.SequenceStore): each prompt's rollouts as append-only records (the
bytes `seqrecord.encode` makes, zstd planes and CRC, as LMDB stores them), decayed per
sequence on read, bounded newest-first loads, prune, stats, copy and merge with any backend
(cache_store.locations).
LMDB stays the embedded default for one machine; a multi-node run points every machine at one
server:

    store = RedisSequenceStore.open("redis://user:password@host:6379/0?prefix=srt")

The URL is `redis://[user:password@]host:port/db`, or `rediss://` for TLS with redis-py's
query options (`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs`), plus
`?prefix=NAME` (default `srt`) to keep several caches in one database. Without a password in
the URL, `SRT_REDIS_PASSWORD` gives it. The password is never shown: `path` and every message
name the URL as `mask_url` writes it, and every failure of the server is one line, the
unreachable or lost server a `CacheUnavailable`, refused credentials a `CacheError`.

Key layout (P = the prefix). Every command and script touches the keys of one hash slot, so the
layout works on Redis Cluster: a prompt's keys share the hash tag `{uid}`, the cache-wide keys
the tag `{P}`:

    {P}:info        hash    format "srt-seqcache", version, half_life, floor, created
    {P}:clock       string  the logical clock (INCRBY)
    {P}:prompts     zset    uid -> last write time: the prompts `uids` lists
    P:{uid}:seqs    hash    record number -> record bytes
    P:{uid}:idx     zset    score = record number, member "number tokens tick weight": the
                            token counts and stamps kept beside the records, so a newest-first
                            walk stops at its bound without reading further records
    P:{uid}:meta    hash    next (record number), seqs, tokens, wall (last write), bytes: the
                            fields of LMDB's meta record
    P:{uid}:applied zset    append id -> time, the last day's: a retried append lands once

How the LMDB guarantees carry over:
- An append is one Lua script per prompt (`APPEND`, its keys one prompt's): it takes the
  prompt's next record numbers and writes the records, their index entries and the meta in one
  atomic step, so concurrent writers lose nothing and a writer killed at any point leaves each
  prompt's append whole or absent. An append may carry an id (`append_id`), which the script
  records with it and skips when it comes again: a writer whose connection dropped cannot tell
  whether its append landed, so it sends it again, and the prompt still gets it once. A
  batch's scripts go in one pipeline (one round trip, after
  one to read the clock). The records are stamped with the tick read right before that
  pipeline: a script cannot read the clock, which lives in another slot, so a tick landing in
  between leaves them one tick older than LMDB would (LMDB re-stamps inside its transaction).
  Prompts of one batch are each atomic, not all together.
- The prompts set lives in another slot than the prompts, so it is kept a superset: a writer
  adds the prompt before and after its script, a prune that empties a prompt removes it and
  adds it back if a writer's meta appeared meanwhile, and `uids` lists only prompts with a meta.
- A bounded read is two round trips: the clock and a page of the index, newest first, then
  (HMGET) the records the index keeps by the bound, skipping what is clearly below the floor,
  and the record that ends the walk (so the client can confirm it). The client applies the
  read's rule exactly (store.select_sequences, shared with LMDB) and reads on only if a
  record the index counted proves corrupt. (A Lua script doing the walk in one round trip
  was slower: it copies every record twice inside the server.)
- Prune scans with the shared rules (cache_store.seqprune) and deletes each planned record by
  number, only if its header is still the one planned (`DELETE`), so appends made meanwhile
  stay; in the same script a prompt's meta is counted again from its remaining records, or
  goes with its last record.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cache_store import seqprune, seqrecord, seqstats
from cache_store.clock import DEFAULT_FLOOR, DEFAULT_HALF_LIFE, check_settings, decay_factor
from cache_store.errors import CacheError, CacheUnavailable, FormatVersionError, NotACacheError
from cache_store.record_keys import key_number, key_uid, record_key
from cache_store.seqenv import FORMAT_NAME, FORMAT_VERSION
from cache_store.seqprune import PruneCriteria, PrunePlan
from cache_store.seqstats import SeqStoreStats
from cache_store.store import SERVER_SCHEMES, SequenceStore, StoredSequence, check_uid, select_sequences

PASSWORD_ENV = "SRT_REDIS_PASSWORD"
DEFAULT_PREFIX = "srt"
CONNECT_TIMEOUT = 10.0  # seconds to reach the server
SOCKET_TIMEOUT = 120.0  # seconds one reply may take (a whole prompt, a stats batch)
BATCH_PROMPTS = 64      # prompts per pipeline when scanning the whole cache (prune, stats)
READ_PAGE = 64          # index entries a bounded read looks at per round trip
_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # no braces: the prefix must not move the hash tag

T = TypeVar("T")

# KEYS: seqs, idx, meta, applied. ARGV: wall, the append's id ('' for none), then per record:
# its bytes, its index entry ("tokens tick weight"). An id the prompt has applied in the last
# day is skipped (returns -1): a retry of an append whose reply was lost lands once. Numbers on
# from the meta (or past the highest record, without one); checks before writing, because a
# script's writes before an error are not undone.
APPEND = """
local id = ARGV[2]
if id ~= '' and redis.call('ZSCORE', KEYS[4], id) then return -1 end
local nxt = tonumber(redis.call('HGET', KEYS[3], 'next'))
if not nxt then
  local top = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  nxt = top[2] and tonumber(top[2]) + 1 or 0
end
local count = (#ARGV - 2) / 2
for i = 0, count - 1 do
  if redis.call('HEXISTS', KEYS[1], nxt + i) == 1 then
    return redis.error_reply('record ' .. (nxt + i) .. ' already exists (meta out of step)')
  end
end
local toks, nbytes = 0, 0
for i = 0, count - 1 do
  local rec, entry = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  redis.call('HSET', KEYS[1], nxt + i, rec)
  redis.call('ZADD', KEYS[2], nxt + i, (nxt + i) .. ' ' .. entry)
  toks = toks + tonumber(string.match(entry, '^%d+'))
  nbytes = nbytes + #rec
end
redis.call('HSET', KEYS[3], 'next', nxt + count, 'wall', ARGV[1])
redis.call('HINCRBY', KEYS[3], 'seqs', count)
redis.call('HINCRBY', KEYS[3], 'tokens', toks)
redis.call('HINCRBY', KEYS[3], 'bytes', nbytes)
if id ~= '' then
  redis.call('ZADD', KEYS[4], ARGV[1], id)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', tonumber(ARGV[1]) - 86400)
  redis.call('EXPIRE', KEYS[4], 172800)
end
return nxt
"""

# KEYS: seqs, idx, meta. ARGV: k, then k pairs (record number, the record's first 32 bytes as
# planned), then the numbers of records the plan keeps as corrupt. Deletes each record still
# holding that header; drops the prompt's keys when its last record goes (returns 1), else counts
# its meta again from what remains, a corrupt record's tokens as 0, as LMDB's prune does.
DELETE = """
local k = tonumber(ARGV[1])
for i = 2, 2 * k, 2 do
  local rec = redis.call('HGET', KEYS[1], ARGV[i])
  if rec and string.sub(rec, 1, 32) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[i], ARGV[i])
  end
end
if redis.call('HLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return 1
end
local corrupt, toks, nbytes = {}, 0, 0
for i = 2 * k + 2, #ARGV do corrupt[ARGV[i]] = true end
for _, e in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local n, t = string.match(e, '^(%d+) (%d+)')
  if n then
    if not corrupt[n] then toks = toks + tonumber(t) end
    nbytes = nbytes + redis.call('HSTRLEN', KEYS[1], n)
  end
end
redis.call('HSET', KEYS[3], 'seqs', redis.call('HLEN', KEYS[1]), 'tokens', toks, 'bytes', nbytes)
return 0
"""

# KEYS: seqs, idx. ARGV: record number, record bytes, index entry. One record's bytes replaced
# as they are, its index entry following its header (tests of corruption handling).
PUT_RAW = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1] .. ' ' .. ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# KEYS: info, clock. ARGV: create ("1"/"0"), format, version, half_life, floor, created.
HEADER = """
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'format', ARGV[2], 'version', ARGV[3], 'half_life', ARGV[4],
             'floor', ARGV[5], 'created', ARGV[6])
  redis.call('SET', KEYS[2], '0', 'NX')
end
local h = redis.call('HMGET', KEYS[1], 'format', 'version', 'half_life', 'floor', 'created')
h[6] = redis.call('GET', KEYS[2])
return h
"""

SCRIPTS = {name: (text, hashlib.sha1(text.encode()).hexdigest())
           for name, text in (("APPEND", APPEND), ("DELETE", DELETE),
                              ("PUT_RAW", PUT_RAW), ("HEADER", HEADER))}


def mask_url(url: str) -> str:
    """`url` with its password shown as `***` (in the user part and in a `password` query
    option): how srt names a cache server anywhere."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or ("@" in url.split("?", 1)[0] and "@" not in parts.netloc):
        return re.sub(r"(://)[^?]*@", r"\1***@", url)  # not a URL urlsplit reads: hide all it may hold
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _split_url(url: str) -> tuple[str, str]:
    """(the URL redis-py reads, without `prefix`; the prefix)."""
    if not isinstance(url, str) or not url.startswith(SERVER_SCHEMES):
        raise ValueError(f"{mask_url(str(url))}: not a cache server URL (redis://host:port/db or rediss://...)")
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = dict(query).get("prefix", DEFAULT_PREFIX)
    if not _PREFIX.match(prefix):
        raise ValueError(f"{mask_url(url)}: prefix must be 1-64 letters, digits, '_', '.' or '-', got {prefix!r}")
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), prefix


def _translated(fn: Callable[..., T]) -> Callable[..., T]:
    """A public method whose redis-py exceptions become one-line cache errors."""

    @functools.wraps(fn)
    def wrapper(self: RedisSequenceStore, *args: Any, **kwargs: Any) -> T:
        try:
            return fn(self, *args, **kwargs)
        except redis.exceptions.RedisError as e:
            raise self._error(e) from None

    return wrapper


def _candidates(page: Sequence[bytes], info: Mapping[str, float], newest: int | None, tokens: int | None,
                kept: int, total: int) -> tuple[list[bytes], int]:
    """The record numbers a read fetches from a page of the index (entries "number tokens tick
    weight", newest first), having kept `kept` sequences of `total` tokens so far: those the
    index puts above the floor (leniently: the records decide, store.select_sequences), up to
    the bound and the record that ends the walk at it; and how many entries that looked at."""
    newest = sys.maxsize if newest is None else newest
    limit = sys.maxsize if tokens is None else tokens
    now, hl, floor = int(info["tick"]), info["half_life"], info["floor"]
    nums: list[bytes] = []
    for i, entry in enumerate(page):
        if kept >= newest:
            return nums, i
        n, t, tick, w = entry.split()
        t, tick = int(t), int(tick)
        w = float(w) * decay_factor(now, tick, hl)
        if w < floor * 0.999999:
            continue
        nums.append(n)
        if kept and total + t > limit:
            return nums, i + 1
        kept, total = kept + 1, total + t
    return nums, len(page)


def _entry(rec: bytes) -> str:
    """A record's index entry (after its number): tokens, tick, weight, from its header."""
    head = seqrecord.peek(rec)
    if head is None or not (0 <= head.weight < math.inf):
        return f"{0 if head is None else head.tokens} 0 1.0"
    return f"{head.tokens} {head.tick} {head.weight!r}"


class RedisSequenceStore(SequenceStore):
    """A sequence store on a Redis or Valkey server (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str, shown: str, readonly: bool, password: str | None) -> None:
        super().__init__()
        self._r, self._p, self._shown, self._readonly = client, prefix, shown, readonly
        self._password = password
        self._settings: dict[str, float] = {}

    @classmethod
    def open(cls, url: str, create: bool = True, readonly: bool = False,
             half_life: float = DEFAULT_HALF_LIFE, floor: float = DEFAULT_FLOOR) -> RedisSequenceStore:
        """Connect to the cache at `url` and check its header (created when missing and `create`;
        half_life/floor apply only then).

        Raises CacheUnavailable for a server that cannot be reached, CacheError for refused
        credentials, NotACacheError for a missing cache (not `create`) or a foreign value at the
        header key, FormatVersionError for a newer format, ValueError for a bad URL or setting.
        """
        check_settings(half_life, floor)
        client_url, prefix = _split_url(url)
        password = urlsplit(url).password or None
        kwargs: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": SOCKET_TIMEOUT,
                                  "retry": Retry(NoBackoff(), 0)}  # never resend: an append is not idempotent
        if password is None and os.environ.get(PASSWORD_ENV):
            password = kwargs["password"] = os.environ[PASSWORD_ENV]
        try:
            client = redis.Redis.from_url(client_url, **kwargs)
        except ValueError as e:
            raise ValueError(f"{mask_url(url)}: not a usable cache server URL ({_scrub(str(e), password)})") from None
        store = cls(client, prefix, mask_url(url), readonly, password)
        try:
            store._check_header(create and not readonly, half_life, floor)
        except BaseException:
            client.close()
            raise
        return store

    @_translated
    def _check_header(self, create: bool, half_life: float, floor: float) -> None:
        try:
            args = ["1" if create else "0", FORMAT_NAME, FORMAT_VERSION, repr(half_life), repr(floor), repr(time.time())]
            fmt, ver, hl, fl, created, clock = self._script("HEADER", [self._g("info"), self._g("clock")], args)
        except redis.exceptions.ResponseError as e:
            if "WRONGTYPE" not in str(e):
                raise
            raise NotACacheError(f"{self.path}: not an srt cache ({self._g('info')} holds something else)") from None
        if fmt is None:
            raise NotACacheError(f"{self.path}: no srt cache here (no {self._g('info')})")
        if fmt != FORMAT_NAME or ver is None or not ver.isdigit():
            raise NotACacheError(f"{self.path}: not an srt cache (format {fmt!r}, version {ver!r})")
        if int(ver) > FORMAT_VERSION:
            raise FormatVersionError(f"{self.path}: sequence store version {int(ver)} is newer than this srt "
                                     f"reads ({FORMAT_VERSION}); upgrade srt")
        self._settings = {"half_life": float(hl), "floor": float(fl), "created": float(created)}

    @property
    def path(self) -> str:
        """The URL, its password masked."""
        return self._shown

    @property
    def readonly(self) -> bool:
        return self._readonly

    def __repr__(self) -> str:
        return f"RedisSequenceStore({self._shown!r})"

    # -- keys and round trips ------------------------------------------------------------

    def _g(self, name: str) -> str:
        """A cache-wide key (slot of `{prefix}`)."""
        return f"{{{self._p}}}:{name}"

    def _k(self, uid: str, name: str) -> str:
        """A key of one prompt (slot of `{uid}`)."""
        return f"{self._p}:{{{uid}}}:{name}"

    def _send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """One pipeline (one round trip); replies in order, a refused command's error in its place."""
        pipe = self._r.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        return pipe.execute(raise_on_error=False)

    def _run(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """`_send`, raising the first error; a script the server does not hold (NOSCRIPT: it
        did not run) is loaded and its commands sent again."""
        out = self._send(commands)
        again = [i for i, r in enumerate(out) if isinstance(r, redis.exceptions.NoScriptError)]
        if again:
            self._send([("SCRIPT", "LOAD", text) for text, _ in SCRIPTS.values()])
            for i, r in zip(again, self._send([commands[i] for i in again])):
                out[i] = r
        for r in out:
            if isinstance(r, Exception):
                raise r
        return out

    def _call(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple:
        return ("EVALSHA", SCRIPTS[name][1], len(keys), *keys, *args)

    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self._run([self._call(name, keys, args)])[0]

    def _error(self, e: Exception) -> CacheError:
        reason = _scrub(str(e).splitlines()[0] if str(e) else type(e).__name__, self._password)
        if isinstance(e, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
                          redis.exceptions.NoPermissionError)):
            if self._password is None:
                reason = f"it needs a password: give it in the URL or in ${PASSWORD_ENV}"
            return CacheError(f"{self.path}: the cache server refused the credentials ({reason})")
        if isinstance(e, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
            os_reason = getattr(e.__context__, "strerror", None)
            return CacheUnavailable(f"{self.path}: cannot reach the cache server ({os_reason or reason})")
        if isinstance(e, redis.exceptions.InvalidResponse):
            return CacheUnavailable(f"{self.path}: cannot reach the cache server (what answers is not Redis: {reason})")
        return CacheError(f"{self.path}: the cache server refused a request ({reason})")

    # -- the clock and the header ---------------------------------------------------------

    @_translated
    def info(self) -> dict[str, float]:
        clock, (hl, fl, created) = self._run([("GET", self._g("clock")),
                                              ("HMGET", self._g("info"), "half_life", "floor", "created")])
        if hl is None or fl is None or created is None:
            raise NotACacheError(f"{self.path}: the cache's header ({self._g('info')}) is gone")
        self._settings = {"half_life": float(hl), "floor": float(fl), "created": float(created)}
        return {"tick": int(clock or 0), **self._settings}

    @_translated
    def now(self) -> int:
        """The logical clock (one round trip)."""
        return int(self._run([("GET", self._g("clock"))])[0] or 0)

    @_translated
    def tick(self, n: int = 1) -> int:
        """Advance the logical clock by `n` (once per rollout batch); the new tick."""
        if n < 0:
            raise ValueError("the clock never goes back")
        self._writable()
        return int(self._run([("INCRBY", self._g("clock"), n)])[0])

    @_translated
    def adopt_header(self, info: Mapping[str, float]) -> None:
        """Take another store's clock, settings and creation time (the start of a copy into
        this one); CacheError unless this cache holds no prompt."""
        self._writable()
        if self.uids():
            raise CacheError(f"{self.path}: not empty; a copy goes into an empty cache (import merges)")
        self._run([("HSET", self._g("info"), "half_life", repr(float(info["half_life"])),
                    "floor", repr(float(info["floor"])), "created", repr(float(info["created"]))),
                   ("SET", self._g("clock"), int(info["tick"]))])
        self.info()

    # -- writing -------------------------------------------------------------------------

    @_translated
    def append_many(self, batch: Mapping[str, Iterable[Sequence[int]]],
                    probs: Mapping[str, Sequence[Any]] | None = None, append_id: str | None = None) -> None:
        """Store new rollouts (weight 1) for each prompt, each prompt atomically, all in one
        pipeline; `probs[uid][i]`, if given and not None, are the probabilities of
        `batch[uid][i]`'s tokens. Stamped with the tick read right before (module docstring).
        With `append_id`, sending the same batch again (a retry after a lost connection, whose
        first try may have landed) appends each prompt's part once. Empty sequences are
        skipped; ValueError (nothing written) for a bad uid, token id or probability."""
        arrays = {uid: arr for uid, arr in self._prepared(batch, probs).items() if arr}
        if not arrays:
            return
        now, wall = self.now(), time.time()
        self._run([c for uid, arr in arrays.items()
                   for c in self._appends(uid, [seqrecord.encode(a, now, 1.0, p) for a, p in arr], wall,
                                          append_id or "")])

    def _appends(self, uid: str, recs: Sequence[bytes], wall: float, append_id: str = "") -> list[tuple]:
        """The commands appending one prompt's records: listed before and after the script, so
        the prompts set holds every prompt with records even if the writer dies in between."""
        args: list[Any] = [repr(wall), append_id]
        for rec in recs:
            args += [rec, _entry(rec)]
        listed = ("ZADD", self._g("prompts"), wall, uid)
        keys = [self._k(uid, "seqs"), self._k(uid, "idx"), self._k(uid, "meta"), self._k(uid, "applied")]
        return [listed, self._call("APPEND", keys, args), listed]

    @_translated
    def append_raw(self, batch: Mapping[str, Sequence[bytes]], walls: Mapping[str, float] | None = None) -> None:
        """Append records as they are (a copy or an import, cache_store.seqtransfer), each
        prompt atomically, in one pipeline; `walls[uid]`, if given, is its last write time."""
        self._writable()
        wall = time.time()
        self._run([c for uid, recs in batch.items() if recs
                   for c in self._appends(check_uid(uid), list(recs), (walls or {}).get(uid, wall))])

    @_translated
    def put_raw(self, key: bytes, value: bytes) -> None:
        """Overwrite one record's bytes as they are (for tests of corruption handling)."""
        uid, n = key_uid(key), key_number(key)
        self._script("PUT_RAW", [self._k(uid, "seqs"), self._k(uid, "idx")], [n, value, _entry(value)])

    # -- reading -------------------------------------------------------------------------

    @_translated
    def read(self, uid: str, newest: int | None = None, tokens: int | None = None) -> list[StoredSequence]:
        """The prompt's sequences as `LmdbSequenceStore.read` gives them (oldest first, decayed,
        the floor applied, corrupt ones warned of once and skipped; with `newest`/`tokens` only
        the newest that fit), by the shared rule (store.select_sequences). Two round trips
        (module docstring): the clock with a page of the index, newest first, then the records
        the index says the read keeps."""
        bounded = newest is not None or tokens is not None
        seqs_key, idx_key = self._k(check_uid(uid), "seqs"), self._k(uid, "idx")
        records: list[tuple[bytes, bytes]] = []
        info, start, kept, total = None, 0, 0, 0
        while True:
            stop = start + READ_PAGE - 1 if bounded else -1
            clock, page = self._run([("GET", self._g("clock")), ("ZREVRANGE", idx_key, start, stop)])
            if info is None:
                info = {"tick": int(clock or 0), **self._settings}
            nums, used = _candidates(page, info, newest, tokens, kept, total)
            for i in range(0, len(nums), 512):
                part = nums[i:i + 512]
                recs = self._run([("HMGET", seqs_key, *part)])[0]
                records += [(record_key(uid.encode(), int(n)), r) for n, r in zip(part, recs) if r is not None]
            seqs, stopped = select_sequences(records if bounded else records[::-1], info, newest, tokens, self._warn)
            if stopped or not bounded or (used == len(page) < READ_PAGE):
                return seqs
            # the page ran out, or a record the index counted proved corrupt: walk on below
            start, kept, total = start + used, len(seqs), sum(len(x.tokens) for x in seqs)

    def _listed(self) -> tuple[list[str], list[str]]:
        """(prompts with a meta, sorted; prompts listed without one: a writer died before its
        script, or a prune emptied them)."""
        listed = [m.decode() for m in self._run([("ZRANGE", self._g("prompts"), 0, -1)])[0]]
        alive = self._run([("EXISTS", self._k(u, "meta")) for u in listed]) if listed else []
        return sorted(u for u, a in zip(listed, alive) if a), [u for u, a in zip(listed, alive) if not a]

    @_translated
    def uids(self) -> list[str]:
        """The prompts holding records, sorted."""
        return self._listed()[0]

    @_translated
    def last_writes(self) -> dict[str, float]:
        """Each prompt's last write time (unix seconds)."""
        uids = self.uids()
        walls = self._run([("HGET", self._k(u, "meta"), "wall") for u in uids]) if uids else []
        return {u: float(w) for u, w in zip(uids, walls) if w is not None}

    @_translated
    def raw_records(self, uid: str) -> list[tuple[bytes, bytes]]:
        """(key, record bytes) of a prompt's records, in append order; keys as LMDB's
        (cache_store.record_keys), so stores of both backends compare."""
        recs = self._run([("HGETALL", self._k(uid, "seqs"))])[0]
        return [(record_key(uid.encode(), n), v) for n, v in sorted((int(k), v) for k, v in recs.items())]

    def _scan(self, uids: Sequence[str], heads: dict[bytes, bytes]) -> Iterator[seqprune.ScannedPrompt]:
        """Every prompt's last write and records for seqprune, BATCH_PROMPTS prompts a round
        trip; `heads` gets each record's first 32 bytes (what DELETE checks)."""
        for i in range(0, len(uids), BATCH_PROMPTS):
            chunk = uids[i:i + BATCH_PROMPTS]
            out = self._run([c for u in chunk for c in (("HGET", self._k(u, "meta"), "wall"),
                                                         ("HGETALL", self._k(u, "seqs")))])
            for u, wall, recs in zip(chunk, out[::2], out[1::2]):
                records = [(record_key(u.encode(), n), v) for n, v in sorted((int(k), v) for k, v in recs.items())]
                heads.update((k, v[:32]) for k, v in records)
                yield u, float(wall or 0.0), records

    # -- maintenance (`srt cache`) --------------------------------------------------------

    @_translated
    def prune(self, criteria: PruneCriteria | None = None, dry_run: bool = False) -> PrunePlan:
        """Remove what `criteria` selects (seqprune's rules, as LMDB's prune), or with
        `dry_run` report it and change nothing. Appends made while it runs are kept: it
        deletes exactly the records it planned to (module docstring)."""
        crit = criteria or PruneCriteria()
        if not dry_run:
            self._writable()
        info, (uids, stale), heads = self.info(), self._listed(), {}
        plan, doomed, kept = seqprune.plan(self._scan(uids, heads), info, crit)
        if dry_run:
            return plan
        by_uid: dict[str, list[Any]] = {}
        for key in doomed:
            by_uid.setdefault(key_uid(key), []).extend((key_number(key), heads[key]))
        calls = [self._call("DELETE", [self._k(u, "seqs"), self._k(u, "idx"), self._k(u, "meta")],
                            [len(pairs) // 2, *pairs, *[key_number(k) for k, toks, _ in kept[u].keep if not toks]])
                 for u, pairs in by_uid.items()]
        emptied = self._run(calls) if calls else []
        self._unlist([u for u, gone in zip(by_uid, emptied) if gone] + stale)
        return plan

    def _unlist(self, uids: list[str]) -> None:
        """Take emptied prompts off the prompts set, then put back any a writer filled
        meanwhile (its own listing may have come before the removal)."""
        if not uids:
            return
        out = self._run([("ZREM", self._g("prompts"), *uids), *[("HGET", self._k(u, "meta"), "wall") for u in uids]])
        back = [(u, float(w)) for u, w in zip(uids, out[1:]) if w is not None]
        if back:
            self._run([("ZADD", self._g("prompts"), w, u) for u, w in back])

    @_translated
    def stats(self, verify: bool = True, top: int = 5) -> SeqStoreStats:
        """What `srt cache stats` reports, as LMDB's stats (seqstats); `disk_bytes` and
        `used_bytes` are the server memory this cache's keys take (MEMORY USAGE), or the record
        bytes where the server refuses MEMORY."""
        info = self.info()
        st = SeqStoreStats(path=self.path, tick=int(info["tick"]), half_life=info["half_life"], floor=info["floor"])
        sm, uids = seqstats.Summary(st, verify, max(top, 1)), self.uids()
        memory: int | None = self._memory([self._g("info"), self._g("clock"), self._g("prompts")])
        for i in range(0, len(uids), BATCH_PROMPTS):
            chunk = uids[i:i + BATCH_PROMPTS]
            metas = self._run([("HMGET", self._k(u, "meta"), "seqs", "tokens", "wall", "bytes") for u in chunk])
            for u, (seqs, toks, wall, nbytes) in zip(chunk, metas):
                if seqs is not None:
                    sm.add_meta(u, int(seqs), int(toks or 0), float(wall or 0.0), int(nbytes or 0))
            if verify:
                for u, recs in zip(chunk, self._run([("HGETALL", self._k(u, "seqs")) for u in chunk])):
                    sm.add_records((record_key(u.encode(), int(n)), v) for n, v in recs.items())
            if memory is not None:
                more = self._memory([self._k(u, name) for u in chunk for name in ("seqs", "idx", "meta")])
                memory = None if more is None else memory + more
        st = sm.done()
        st.disk_bytes = st.used_bytes = st.record_bytes if memory is None else memory
        return self._with_memory(st, top)

    def _memory(self, keys: list[str]) -> int | None:
        """Server memory of `keys` (MEMORY USAGE); None where the server refuses the command."""
        out = self._send([("MEMORY", "USAGE", k, "SAMPLES", 0) for k in keys])
        if any(isinstance(r, redis.exceptions.ResponseError) for r in out):
            return None
        return sum(int(r or 0) for r in out)

    def compact(self) -> tuple[int, int]:
        """A server has nothing to compact: CacheError."""
        raise CacheError(f"{self.path}: a cache server has nothing to compact (it frees a record's memory "
                         "when the record is deleted)")

    def check_compactable(self) -> None:
        """CacheError, as `compact` (so a prune with --compact stops before deleting)."""
        self.compact()

    def close(self) -> None:
        self._r.close()


def _scrub(text: str, password: str | None) -> str:
    """`text` without the password, as written in the URL or percent-decoded."""
    for form in {password, unquote(password)} if password else ():
        text = text.replace(form, "***")
    return text
