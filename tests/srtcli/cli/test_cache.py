"""`srt cache` end to end on real caches (the sequence store): add (ids, text, steps pools),
stats, prune by every criterion, export, import; bad input gives one line, exit 1, no traceback,
and changes nothing; a cache of the earlier tree format is refused by every command."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_store.seqstore import LmdbSequenceStore

from cache_store.store import load_tree
from cache_store.uid import prompt_uid
from srtcli.cli import cli
from tests.cache_store.support import old_format_cache

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")


def make_tokenizer(path: Path, words: list[str]) -> Path:
    """A real HF tokenizer directory (word-level, with a chat template), built locally."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "</s>", "<|im_start|>", "<|im_end|>"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="</s>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT
    fast.save_pretrained(str(path))
    return path


WORDS = ["user", "assistant", "what", "is", "2+3", "?", "it", "5", "<answer>", "</answer>"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"), WORDS)


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def last_json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not an uncaught error
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for f in fragments:
        assert f in lines[0], lines[0]


def snapshot(d: Path) -> dict[str, str]:
    """Contents of a directory (LMDB's lock file aside: readers register there)."""
    if not d.exists():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())
            if p.is_file() and p.name != "lock.mdb"}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def sequences(cache: Path, uid: str) -> list[list[int]]:
    """The token lists stored for a prompt, in append order."""
    with LmdbSequenceStore.open(cache, create=False) as s:
        return [list(map(int, x.tokens)) for x in s.read(uid)]


def tick(cache: Path, n: int) -> None:
    """Advance the cache's clock as `srt rollout` does once per batch."""
    with LmdbSequenceStore.open(cache, create=False) as s:
        s.tick(n)


def flip_a_byte(cache: Path, uid: str, offset: int = -3) -> None:
    """Corrupt the first record of a prompt (one flipped bit in its payload)."""
    with LmdbSequenceStore.open(cache, create=False) as s:
        key, rec = s.raw_records(uid)[0]
        rec = bytearray(rec)
        rec[offset] ^= 0x20
        s.put_raw(key, bytes(rec))


# -- add ---------------------------------------------------------------------------------


def test_add_token_ids_stores_anchor_plus_response(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt_ids": [7, 8, 9], "response_ids": [1, 2, 3, 1, 2]},
        {"prompt_ids": [7, 8, 9], "response_ids": [1, 2, 4]},
        {"prompt_ids": [5], "response_ids": []},
    ])
    cache = tmp_path / "c"
    out = last_json(run("cache", "add", str(src), "--cache", str(cache), "--tokenizer-fingerprint", "fp", "--json"))
    assert (out["rollouts"], out["sequences"], out["tokens"], out["trees"], out["skipped"]) == (3, 2, 8, 2, 0)
    uid = prompt_uid([7, 8, 9], "fp")
    assert sequences(cache, uid) == [[9, 1, 2, 3, 1, 2], [9, 1, 2, 4]]  # the anchor, then the response
    assert sequences(cache, prompt_uid([5], "fp")) == []  # an empty response stores nothing
    assert sequences(cache, prompt_uid([7, 8, 9], "other")) == []  # another tokenizer, another prompt
    with LmdbSequenceStore.open(cache, create=False) as s:
        assert s.now() == 0  # adding never advances the clock
        assert load_tree(s, uid).draft([9, 1, 2], budget=4).tokens == [3, 1, 2]
    stats = last_json(run("cache", "stats", "--cache", str(cache), "--json"))
    assert (stats["trees"], stats["prompts"], stats["sequences"], stats["tokens"], stats["corrupt"]) == (1, 1, 2, 10, 0)
    assert stats["memory_bytes"] > 0 and stats["disk_bytes"] > 0 and stats["record_bytes"] == stats["live_bytes"] > 0
    assert stats["cache"] == stats["path"] == str(cache) and stats["tick"] == 0


def test_add_token_ids_with_logprobs_stores_the_policys_probabilities(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt_ids": [7, 8], "response_ids": [1, 2, 3], "response_logprobs": [-0.5, None, 0.0]},
        {"prompt_ids": [7, 8], "response_ids": [4]},
        {"prompt_ids": [7, 8], "response_ids": [5], "response_logprobs": [None]},  # nothing known
    ])
    cache = tmp_path / "c"
    out = last_json(run("cache", "add", str(src), "--cache", str(cache), "--tokenizer-fingerprint", "fp", "--json"))
    assert (out["sequences"], out["with_probs"]) == (3, 1)
    with LmdbSequenceStore.open(cache, create=False) as s:
        a, b, c = s.read(prompt_uid([7, 8], "fp"))
    assert a.tokens.tolist() == [8, 1, 2, 3] and b.probs is None and c.probs is None
    assert math.isnan(a.probs[0]) and math.isnan(a.probs[2])  # the anchor, and the token given null
    assert abs(a.probs[1] - math.exp(-0.5)) <= 1 / 508 and a.probs[3] == 1.0


def test_add_appends_to_an_existing_cache_at_its_current_tick(tmp_path):
    cache = tmp_path / "c"
    src = write_jsonl(tmp_path / "r.jsonl", [{"prompt_ids": [1], "response_ids": [2, 3]}])
    flags = ("--cache", str(cache), "--tokenizer-fingerprint", "fp")
    last_json(run("cache", "add", str(src), *flags, "--half-life", "10", "--floor", "0.3", "--json"))
    tick(cache, 10)
    last_json(run("cache", "add", str(src), *flags, "--half-life", "99", "--json"))  # settings: new caches only
    with LmdbSequenceStore.open(cache, create=False) as s:
        got = [(list(map(int, x.tokens)), x.tick, x.weight) for x in s.read(prompt_uid([1], "fp"))]
        assert (s.info()["half_life"], s.info()["floor"], s.now()) == (10.0, 0.3, 10)
    assert got == [([1, 2, 3], 0, 0.5), ([1, 2, 3], 10, 1.0)]  # the first one decayed one half-life


def test_add_writes_in_batches_bounded_by_tokens(tmp_path):
    from cache_store.warm import Warmer

    with LmdbSequenceStore.open(tmp_path / "c") as s:
        w = Warmer(s, "fp", batch_tokens=10)
        for p in range(5):
            w.add([p], [p + 1] * 4)  # 5 stored tokens each: a batch every second rollout
            assert sum(len(s.read(prompt_uid([q], "fp"))) for q in range(5)) == 2 * ((p + 1) // 2)
        w.flush()
        assert w.batches == 3 and [sequences(tmp_path / "c", prompt_uid([p], "fp")) for p in range(5)] == [
            [[p] + [p + 1] * 4] for p in range(5)]


def test_add_text_uses_the_chat_template_and_fingerprint(tmp_path, tok_dir):
    from srtcli.tokenizers import encode_prompt, encode_response, load_tokenizer, tokenizer_fingerprint

    src = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt": "what is 2+3 ?", "response": "it is 5"},
        {"prompt": [{"role": "user", "content": "what is 2+3 ?"}], "response": "<answer> 5 </answer>"},
    ])
    cache = tmp_path / "c"
    out = last_json(run("cache", "add", str(src), "--cache", str(cache), "--model", str(tok_dir), "--json"))
    tok = load_tokenizer(tok_dir)
    fp = tokenizer_fingerprint(tok)
    ids = encode_prompt(tok, "what is 2+3 ?")
    assert ids == encode_prompt(tok, [{"role": "user", "content": "what is 2+3 ?"}])
    assert tok.decode(ids).replace(" ", "") == "<|im_start|>userwhatis2+3?<|im_end|><|im_start|>assistant"
    assert out["trees"] == 1 and out["tokenizer_fingerprint"] == fp
    resp = [encode_response(tok, "it is 5"), encode_response(tok, "<answer> 5 </answer>")]
    assert sequences(cache, prompt_uid(ids, fp)) == [ids[-1:] + resp[0], ids[-1:] + resp[1]]
    other = load_tokenizer(make_tokenizer(tmp_path / "tok2", WORDS[::-1]))
    assert tokenizer_fingerprint(other) != fp


def test_add_steps_pool_takes_prompt_and_whole_trajectory(tmp_path):
    from srtcli.pool import PoolWriter, StepRecord

    pool = tmp_path / "pool"
    with PoolWriter(pool / "a.jsonl") as w:
        # trajectory t1: prompt [3,4], turn 0 generates [5,6], a tool result [7], turn 1 [8]
        w.write(StepRecord("p", "t1", 1, [3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 1], [0.0] * 6, 1.0))
        w.write(StepRecord("p", "t1", 0, [3, 4, 5, 6], [0, 0, 1, 1], [0.0] * 4, 0.0))
        w.write(StepRecord("p", "t2", 0, [3, 4, 9], [0, 0, 1], [0.0] * 3, 0.0))
    cache = tmp_path / "c"
    out = last_json(run("cache", "add", str(pool), "--cache", str(cache), "--tokenizer-fingerprint", "fp", "--json"))
    assert (out["rollouts"], out["trees"]) == (2, 1)
    assert sequences(cache, prompt_uid([3, 4], "fp")) == [[4, 5, 6, 7, 8], [4, 9]]


BAD_LINES = [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "JSON object"),
    ('{"prompt_ids": [1, -2], "response_ids": [3]}', "negative token id"),
    ('{"prompt_ids": [1, "2"], "response_ids": [3]}', "list of integers"),
    ('{"prompt_ids": [1], "response_ids": 3}', "list of integers"),
    ('{"prompt_ids": [], "response_ids": [3]}', "must not be empty"),
    ('{"prompt": 5, "response": "x"}', "`prompt`"),
    ('{"prompt": [{"role": "user"}], "response": "x"}', "messages"),
    ('{"response_text": "x"}', "needs"),
    ('{"prompt_ids": [1], "response_ids": [3, 4], "response_logprobs": [-0.1]}', "one value per response token"),
    ('{"prompt_ids": [1], "response_ids": [3], "response_logprobs": [0.5]}', "<= 0"),
    ('{"prompt_ids": [1], "response_ids": [3], "response_logprobs": ["x"]}', "list of numbers"),
    ('{"prompt_ids": [1], "response_ids": [3], "response_logprobs": -0.5}', "list of numbers"),
    ('{"prompt": "q", "response": "a", "response_logprobs": [-0.5]}', "needs `response_ids`"),
]


@pytest.mark.parametrize("line,reason", BAD_LINES)
def test_add_bad_lines_name_file_and_line_and_change_nothing(tmp_path, line, reason):
    cache = tmp_path / "c"
    run("cache", "add", str(write_jsonl(tmp_path / "ok.jsonl", [{"prompt_ids": [1], "response_ids": [2]}])),
        "--cache", str(cache), "--tokenizer-fingerprint", "fp")
    before = snapshot(cache)
    src = write_jsonl(tmp_path / "bad.jsonl", [{"prompt_ids": [1], "response_ids": [2, 3]}, "", line])
    r = run("cache", "add", str(src), "--cache", str(cache), "--tokenizer-fingerprint", "fp")
    one_line_error(r, f"{src}:3:", reason)
    assert snapshot(cache) == before  # the good first line was not committed either
    r = run("cache", "add", str(src), "--cache", str(cache), "--tokenizer-fingerprint", "fp", "--skip-bad", "--json")
    assert last_json(r)["skipped"] == 1 and last_json(r)["rollouts"] == 1


def test_add_usage_errors(tmp_path, tok_dir):
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"prompt_ids": [1], "response_ids": [2]}])
    text = write_jsonl(tmp_path / "text.jsonl", [{"prompt": "hi", "response": "x"}])
    cache = tmp_path / "c"
    one_line_error(run("cache", "add", str(ids), "--cache", str(cache)), "--tokenizer-fingerprint")
    one_line_error(run("cache", "add", str(text), "--cache", str(cache), "--tokenizer-fingerprint", "f"), "--model")
    one_line_error(run("cache", "add", str(tmp_path / "none.jsonl"), "--cache", str(cache)), "no such file")
    one_line_error(run("cache", "add", str(text), "--cache", str(cache), "--model", str(tmp_path / "nomodel")),
                   "model directory not found")
    (tmp_path / "empty").mkdir()
    one_line_error(run("cache", "add", str(text), "--cache", str(cache), "--model", str(tmp_path / "empty")),
                   "not a model directory")
    one_line_error(run("cache", "add", str(ids), "--cache", str(cache), "--model", str(tok_dir),
                       "--tokenizer-fingerprint", "wrong"), "differs")
    big = write_jsonl(tmp_path / "big.jsonl", [{"prompt_ids": [1], "response_ids": [2, 999]}])
    one_line_error(run("cache", "add", str(big), "--cache", str(cache), "--model", str(tok_dir)),
                   f"{big}:1:", "outside the tokenizer's vocabulary (size 15)")
    assert not cache.exists()  # nothing was created by any of them
    notcache = tmp_path / "notcache"
    notcache.mkdir()
    (notcache / "x").write_text("mine")
    one_line_error(run("cache", "add", str(ids), "--cache", str(notcache), "--tokenizer-fingerprint", "f"),
                   "not an srt cache")
    assert os.listdir(notcache) == ["x"]


# -- stats / prune / export / import ------------------------------------------------------


def add_rows(tmp_path: Path, cache: Path, prompts: range, name: str) -> None:
    rows = [{"prompt_ids": [p], "response_ids": list(range(p, p + 30))} for p in prompts]
    r = run("cache", "add", str(write_jsonl(tmp_path / name, rows)), "--cache", str(cache),
            "--tokenizer-fingerprint", "fp")
    assert r.exit_code == 0, r.output


@pytest.fixture
def filled(tmp_path) -> Path:
    """20 prompts of one 31-token sequence each; prompts 0-9 written before prompts 10-19."""
    cache = tmp_path / "c"
    add_rows(tmp_path, cache, range(10), "first.jsonl")
    add_rows(tmp_path, cache, range(10, 20), "second.jsonl")
    return cache


def uid(p: int) -> str:
    return prompt_uid([p], "fp")


def kept(cache: Path) -> list[int]:
    """The prompts (of 0-19) that still have sequences."""
    return [p for p in range(20) if sequences(cache, uid(p))]


def prune(cache: Path, *flags: str) -> dict:
    return last_json(run("cache", "prune", "--cache", str(cache), *flags, "--json"))


def test_prune_max_trees_evicts_the_least_recently_written_prompts(filled):
    before = snapshot(filled)
    out = prune(filled, "--max-trees", "5", "--dry-run")
    assert (out["dry_run"], out["lru_evicted"], out["trees_before"], out["trees_after"]) == (True, 15, 20, 5)
    assert set(out["lru_uids"][:10]) == {uid(p) for p in range(10)}  # the earlier add goes first
    assert snapshot(filled) == before
    one_line_error(run("cache", "prune", "--cache", str(filled), "--max-trees", "5"), "--yes")
    assert snapshot(filled) == before
    out = prune(filled, "--max-trees", "5", "--yes", "--compact")
    assert (out["trees_after"], out["sequences_removed"], out["sequences_after"]) == (5, 15, 5)
    assert out["file_bytes_after"] <= out["file_bytes_before"]
    assert len(kept(filled)) == 5 and set(kept(filled)) < set(range(10, 20))
    assert last_json(run("cache", "stats", "--cache", str(filled), "--json"))["trees"] == 5


def test_prune_max_bytes_keeps_the_newest_prompts_within_the_budget(filled):
    total = last_json(run("cache", "stats", "--cache", str(filled), "--json"))["record_bytes"]
    budget = total // 2
    out = prune(filled, "--max-bytes", str(budget), "--dry-run")
    assert out["bytes_before"] == total and out["bytes_after"] <= budget < out["bytes_after"] + total // 20
    out = prune(filled, "--max-bytes", str(budget), "--yes")
    assert last_json(run("cache", "stats", "--cache", str(filled), "--json"))["record_bytes"] == out["bytes_after"]
    assert kept(filled) == list(range(20 - out["trees_after"], 20))
    assert prune(filled, "--max-bytes", "1K", "--yes")["bytes_after"] <= 1024


def test_prune_older_than_goes_by_the_last_write(filled):
    before = snapshot(filled)
    assert prune(filled, "--older-than", "1d", "--yes")["trees_removed"] == 0
    assert prune(filled, "--older-than", "0s", "--dry-run")["old_dropped"] == 20
    assert snapshot(filled) == before
    out = prune(filled, "--older-than", "0s", "--yes")
    assert (out["old_dropped"], out["trees_after"], kept(filled)) == (20, 0, [])


def test_prune_min_count_drops_sequences_below_that_decayed_weight(filled, tmp_path):
    tick(filled, 100)  # one half-life: every stored sequence now weighs 0.5
    add_rows(tmp_path, filled, range(5), "again.jsonl")  # prompts 0-4 get a second one, weight 1
    before = snapshot(filled)
    out = prune(filled, "--min-count", "0.75", "--dry-run")
    assert (out["light_dropped"], out["trees_after"], out["sequences_after"]) == (20, 5, 5)
    assert snapshot(filled) == before
    out = prune(filled, "--min-count", "0.75", "--yes")
    assert (out["light_dropped"], out["trimmed_empty"], out["lru_evicted"]) == (20, 15, 0)
    assert kept(filled) == list(range(5))
    with LmdbSequenceStore.open(filled, create=False) as s:
        assert [(x.tick, x.weight) for x in s.read(uid(0))] == [(100, 1.0)]  # the old one went
    assert prune(filled, "--min-count", "0.75", "--yes")["sequences_removed"] == 0


def test_every_prune_removes_what_is_below_the_floor(filled):
    tick(filled, 400)  # 0.5 ** 4 = 0.0625 < the floor 0.1: never loaded any more
    out = prune(filled, "--max-trees", "100", "--yes")
    assert (out["light_dropped"], out["trees_after"]) == (20, 0)


def test_stats_and_prune_handle_a_corrupt_record(filled):
    flip_a_byte(filled, uid(3))
    st = last_json(run("cache", "stats", "--cache", str(filled), "--json"))
    assert (st["corrupt"], st["corrupt_uids"], st["trees"], st["sequences"]) == (1, [uid(3)], 20, 20)
    quick = last_json(run("cache", "stats", "--cache", str(filled), "--no-verify", "--json"))
    assert (quick["corrupt"], quick["trees"]) == (None, 20)
    text = run("cache", "stats", "--cache", str(filled))
    assert f"corrupt      1 (first: {uid(3)})" in text.output
    before = snapshot(filled)
    assert prune(filled, "--drop-corrupt", "--dry-run")["corrupt_dropped"] == 1
    assert snapshot(filled) == before
    out = prune(filled, "--drop-corrupt", "--yes")
    assert (out["corrupt_dropped"], out["trees_after"]) == (1, 19)
    assert last_json(run("cache", "stats", "--cache", str(filled), "--json"))["corrupt"] == 0
    assert kept(filled) == [p for p in range(20) if p != 3]


def test_export_import_and_default_location(filled, tmp_path):
    exp = tmp_path / "exp"
    out = last_json(run("cache", "export", str(exp), "--cache", str(filled), "--json"))
    assert out["out"] == str(exp) and out["bytes"] == (exp / "data.mdb").stat().st_size
    one_line_error(run("cache", "export", str(exp), "--cache", str(filled)), "already exists")
    home = tmp_path / "home"
    env = {"SRT_CACHE": str(home)}
    first = last_json(run("cache", "import", str(exp), "--json", env=env))
    assert (first["trees"], first["new"], first["sequences"], first["tokens"]) == (20, 20, 20, 20 * 31)
    assert last_json(run("cache", "import", str(exp), "--json", env=env))["new"] == 0
    st = last_json(run("cache", "stats", "--json", env=env))
    assert st["path"] == str(home) and (st["sequences"], st["tokens"]) == (40, 2 * 20 * 31)  # imported twice
    assert sequences(home, uid(7)) == [[7] + list(range(7, 37))] * 2
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cache: {home}\ntop: 1\n")
    assert len(last_json(run("cache", "stats", "--config", str(cfg), "--json"))["largest"]) == 1


def test_bad_input_to_every_command_is_one_line(filled, tmp_path):
    missing, other = tmp_path / "missing", tmp_path / "other"
    other.mkdir()
    (other / "f").write_text("x")
    for cmd in (["stats"], ["prune", "--max-trees", "1", "--yes"], ["export", str(tmp_path / "e")]):
        one_line_error(run("cache", *cmd, "--cache", str(missing)), "no srt cache here")
        one_line_error(run("cache", *cmd, "--cache", str(other)), f"{other}: ", "srt cache")
    fresh = tmp_path / "fresh"
    one_line_error(run("cache", "import", str(missing), "--cache", str(fresh)), "no srt cache here")
    one_line_error(run("cache", "import", str(other), "--cache", str(fresh)), f"{other}: ", "srt cache")
    one_line_error(run("cache", "import", str(filled), "--cache", str(filled)), "itself")
    before = snapshot(filled)
    for flags, msg in ((["--older-than", "3 days"], "bad duration"), (["--older-than", "-1d"], "bad duration"),
                       (["--max-bytes", "lots"], "bad size"), (["--min-count", "-1"], "--min-count"), ([], "nothing to do")):
        one_line_error(run("cache", "prune", "--cache", str(filled), "--yes", *flags), msg)
    assert snapshot(filled) == before
    assert not missing.exists() and not fresh.exists() and os.listdir(other) == ["f"]
    assert not (tmp_path / "e").exists()


def test_an_earlier_format_cache_is_refused_by_every_command(filled, tmp_path):
    from tests.cache_store.support import dir_digest

    old = old_format_cache(tmp_path / "old")
    before = dir_digest(old)
    src = write_jsonl(tmp_path / "r.jsonl", [{"prompt_ids": [1], "response_ids": [2]}])
    for cmd in (["stats"], ["prune", "--max-trees", "1", "--yes"], ["prune", "--compact", "--yes"],
                ["export", str(tmp_path / "e")], ["import", str(filled)],
                ["add", str(src), "--tokenizer-fingerprint", "f"]):
        one_line_error(run("cache", *cmd, "--cache", str(old)), "earlier tree format", "srt cache add")
        assert dir_digest(old) == before, cmd
    into = tmp_path / "into"
    one_line_error(run("cache", "import", str(old), "--cache", str(into)), "earlier tree format")
    assert dir_digest(old) == before and not into.exists() and not (tmp_path / "e").exists()


def test_a_newer_format_is_refused_by_every_command(filled, tmp_path):
    import lmdb

    env = lmdb.open(str(filled), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"version", b"9", db=env.open_db(b"info", txn=txn))
    env.close()
    before = snapshot(filled)
    src = write_jsonl(tmp_path / "r.jsonl", [{"prompt_ids": [1], "response_ids": [2]}])
    for cmd in (["stats"], ["prune", "--max-trees", "1", "--yes"], ["export", str(tmp_path / "e")],
                ["import", str(tmp_path / "nothing")], ["add", str(src), "--tokenizer-fingerprint", "f"]):
        one_line_error(run("cache", *cmd, "--cache", str(filled)))
    r = run("cache", "stats", "--cache", str(filled))
    assert "newer" in r.output and "upgrade srt" in r.output
    assert snapshot(filled) == before


def test_management_commands_never_import_torch(filled, tmp_path):
    code = (
        "import sys, json; from srtcli.cli import cli\n"
        f"for args in (['stats'], ['prune', '--max-trees', '30', '--yes'], ['export', {str(tmp_path / 'x')!r}],\n"
        f"             ['import', {str(tmp_path / 'x')!r}]):\n"
        f"    try: cli(['cache', *args, '--cache', {str(filled)!r}, '--json'])\n"
        "    except SystemExit as e: assert e.code in (0, None), e.code\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"torch": False, "transformers": False}


def test_warming_from_a_pool_stores_exactly_the_sequences_rollout_stored(tmp_path):
    """`srt rollout` (no run-ahead) appends its samples while sampling; `srt cache add` of the
    pool it wrote must store the same sequences under the same uids (same prompt encoding,
    fingerprint, anchor token and response span)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model = make_tokenizer(tmp_path / "model", WORDS)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS) + 5, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=2, pad_token_id=1, bos_token_id=None)
    LlamaForCausalLM(cfg).save_pretrained(str(model))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in ("what is 2+3 ?", "it is 5", "what ?")])
    r = run("rollout", "--prompts", str(prompts), "--model", str(model), "-n", "4", "--max-new-tokens", "24",
            "--cache", str(tmp_path / "c1"), "--out", str(tmp_path / "pool"), "--no-run-ahead", "--json")
    assert r.exit_code == 0, r.output
    last_json(run("cache", "add", str(tmp_path / "pool"), "--model", str(model), "--cache", str(tmp_path / "c2"),
                  "--json"))
    with LmdbSequenceStore.open(tmp_path / "c1", create=False) as a, \
            LmdbSequenceStore.open(tmp_path / "c2", create=False) as b:
        uids = sorted(a.uids())
        assert len(uids) == 3 and uids == sorted(b.uids())
    for u in uids:  # the order of appends may differ (samples finish in any order)
        assert sorted(sequences(tmp_path / "c1", u)) == sorted(sequences(tmp_path / "c2", u))
        assert len(sequences(tmp_path / "c1", u)) == 4


def test_drafting_skips_a_corrupt_record_and_goes_on(filled):
    """The rollout drafter on a cache with a flipped byte: that prompt drafts from an empty
    tree (with a warning), the others still draft, nothing crashes."""
    from cache_store.errors import CorruptSequenceWarning
    from srtcli.rollout.drafters.srt import SrtDrafter
    from srtcli.rollout.engine.sequence import Sequence
    from srtcli.rollout.tree_session import TreeSession
    from srtcli.store_link import StoreLink

    bad, good = uid(3), uid(4)
    flip_a_byte(filled, bad, offset=40)
    with LmdbSequenceStore.open(filled, create=False) as s:
        d = SrtDrafter(TreeSession(StoreLink(s)))
        seqs = [Sequence([p], 8, group=u) for u, p in ((bad, 3), (good, 4))]
        with pytest.warns(CorruptSequenceWarning, match=bad):
            d.begin(seqs[0])
        d.begin(seqs[1])
        assert d.propose(seqs[0], 8).tokens == []
        assert len(d.propose(seqs[1], 8).tokens) > 0
        assert d.stats()["cache_hits"] == 1


def test_prune_compact_refuses_up_front_while_another_process_uses_the_cache(filled):
    code = ("import time; from cache_store.seqstore import LmdbSequenceStore; "
            f"s = LmdbSequenceStore.open({str(filled)!r}); print('open', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "open"
        before = snapshot(filled)
        one_line_error(run("cache", "prune", "--cache", str(filled), "--max-trees", "1", "--compact", "--yes"),
                       "in use by another process")
        assert snapshot(filled) == before  # nothing was pruned either
    finally:
        p.kill()
        p.wait()


def test_the_help_says_what_the_changed_flags_now_mean():
    text = " ".join(run("cache", "prune", "--help").output.split())
    assert "Keep at most N prompts" in text and "sequences whose decayed weight is below X" in text
    assert "A sequence whose decayed weight is below this" in " ".join(run("cache", "add", "--help").output.split())
