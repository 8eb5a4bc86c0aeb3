"""`srt cache` end to end on real caches: add (ids, text, steps pools), stats, prune,
export, import; bad input gives one line, exit 1, no traceback, and changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_store.store import CacheStore
from cache_store.trie import TokenTree
from cache_store.uid import prompt_uid
from srtcli.cli import cli

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


def tree(*seqs: list[int]) -> bytes:
    t = TokenTree()
    for s in seqs:
        t.insert(s)
    return t.to_bytes()


def stored(cache: Path, uid: str) -> bytes | None:
    s = CacheStore.open(cache, create=False)
    try:
        t = s.load(uid)
        return None if t is None else t.to_bytes()
    finally:
        s.close()


# -- add ---------------------------------------------------------------------------------


def test_add_token_ids_stores_anchor_plus_response(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt_ids": [7, 8, 9], "response_ids": [1, 2, 3, 1, 2]},
        {"prompt_ids": [7, 8, 9], "response_ids": [1, 2, 4]},
        {"prompt_ids": [5], "response_ids": []},
    ])
    cache = tmp_path / "c"
    out = last_json(run("cache", "add", str(src), "--cache", str(cache), "--tokenizer-fingerprint", "fp", "--json"))
    assert (out["rollouts"], out["tokens"], out["trees"], out["skipped"]) == (3, 8, 2, 0)
    assert stored(cache, prompt_uid([7, 8, 9], "fp")) == tree([9, 1, 2, 3, 1, 2], [9, 1, 2, 4])
    assert stored(cache, prompt_uid([7, 8, 9], "other")) is None  # another tokenizer, another tree
    stats = last_json(run("cache", "stats", "--cache", str(cache), "--json"))
    assert stats["trees"] == 1 and stats["corrupt"] == 0 and stats["tokens"] == 10.0
    assert {"trees", "nodes", "tokens", "disk_bytes", "corrupt"} <= set(stats)


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
    assert tok.decode(ids) .replace(" ", "") == "<|im_start|>userwhatis2+3?<|im_end|><|im_start|>assistant"
    assert out["trees"] == 1 and out["tokenizer_fingerprint"] == fp
    resp = [encode_response(tok, "it is 5"), encode_response(tok, "<answer> 5 </answer>")]
    assert stored(cache, prompt_uid(ids, fp)) == tree(ids[-1:] + resp[0], ids[-1:] + resp[1])
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
    assert stored(cache, prompt_uid([3, 4], "fp")) == tree([4, 5, 6, 7, 8], [4, 9])


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


@pytest.fixture
def filled(tmp_path) -> Path:
    rows = [{"prompt_ids": [p], "response_ids": list(range(p, p + 30))} for p in range(20)]
    cache = tmp_path / "c"
    r = run("cache", "add", str(write_jsonl(tmp_path / "r.jsonl", rows)), "--cache", str(cache),
            "--tokenizer-fingerprint", "fp")
    assert r.exit_code == 0, r.output
    return cache


def test_prune_dry_run_refusal_and_compaction(filled):
    before = snapshot(filled)
    out = last_json(run("cache", "prune", "--cache", str(filled), "--max-trees", "5", "--dry-run", "--json"))
    assert (out["lru_evicted"], out["trees_after"]) == (15, 5)
    assert snapshot(filled) == before
    one_line_error(run("cache", "prune", "--cache", str(filled), "--max-trees", "5"), "--yes")
    assert snapshot(filled) == before
    out = last_json(run("cache", "prune", "--cache", str(filled), "--max-trees", "5", "--yes", "--compact", "--json"))
    assert out["trees_after"] == 5 and out["file_bytes_after"] <= out["file_bytes_before"]
    assert last_json(run("cache", "stats", "--cache", str(filled), "--json"))["trees"] == 5
    out = last_json(run("cache", "prune", "--cache", str(filled), "--max-bytes", "1K", "--yes", "--json"))
    assert out["bytes_after"] <= 1024
    out = last_json(run("cache", "prune", "--cache", str(filled), "--older-than", "0s", "--yes", "--json"))
    assert out["trees_after"] == 0


def _nodes_of(cache: Path, uid: str) -> int:
    from cache_store.codec import MetaRecord

    s = CacheStore.open(cache)
    try:
        with s.env.begin() as txn:
            return MetaRecord.unpack(txn.get(uid.encode(), db=s.handle().dbs["meta"])).nodes
    finally:
        s.close()


def test_stats_and_prune_handle_a_corrupt_record(filled):
    s = CacheStore.open(filled)
    uid = prompt_uid([3], "fp")
    rec = bytearray(s.raw_record(uid))
    rec[-5] ^= 0x20
    with s.env.begin(write=True) as txn:
        txn.put(uid.encode(), bytes(rec), db=s.handle().dbs["trees"])
    s.close()
    st = last_json(run("cache", "stats", "--cache", str(filled), "--json"))
    assert (st["corrupt"], st["corrupt_uids"], st["trees"]) == (1, [uid], 19)
    quick = last_json(run("cache", "stats", "--cache", str(filled), "--no-verify", "--json"))
    assert (quick["corrupt"], quick["trees"], quick["nodes"]) == (None, 20, st["nodes"] + _nodes_of(filled, uid))
    out = last_json(run("cache", "prune", "--cache", str(filled), "--drop-corrupt", "--yes", "--json"))
    assert out["corrupt_dropped"] == 1
    assert last_json(run("cache", "stats", "--cache", str(filled), "--json"))["corrupt"] == 0


def test_export_import_and_default_location(filled, tmp_path):
    exp = tmp_path / "exp"
    last_json(run("cache", "export", str(exp), "--cache", str(filled), "--json"))
    one_line_error(run("cache", "export", str(exp), "--cache", str(filled)), "already exists")
    home = tmp_path / "home"
    env = {"SRT_CACHE": str(home)}
    assert last_json(run("cache", "import", str(exp), "--json", env=env))["trees"] == 20
    assert last_json(run("cache", "import", str(exp), "--json", env=env))["new"] == 0
    st = last_json(run("cache", "stats", "--json", env=env))
    assert st["path"] == str(home) and st["tokens"] == 2 * 20 * 31  # imported twice: doubled
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cache: {home}\ntop: 1\n")
    assert len(last_json(run("cache", "stats", "--config", str(cfg), "--json"))["largest"]) == 1


def test_bad_input_to_every_command_is_one_line(filled, tmp_path):
    missing, other = tmp_path / "missing", tmp_path / "other"
    other.mkdir()
    (other / "f").write_text("x")
    for cmd in (["stats"], ["prune", "--max-trees", "1", "--yes"], ["export", str(tmp_path / "e")]):
        one_line_error(run("cache", *cmd, "--cache", str(missing)), "no such cache")
        one_line_error(run("cache", *cmd, "--cache", str(other)), "not an srt cache")
    one_line_error(run("cache", "import", str(missing), "--cache", str(filled)), "no such cache")
    one_line_error(run("cache", "import", str(other), "--cache", str(filled)), "not an srt cache")
    one_line_error(run("cache", "import", str(filled), "--cache", str(filled)), "itself")
    before = snapshot(filled)
    for flags, msg in ((["--older-than", "3 days"], "bad duration"), (["--older-than", "-1d"], "bad duration"),
                       (["--max-bytes", "lots"], "bad size"), (["--min-count", "-1"], "--min-count"), ([], "nothing to do")):
        one_line_error(run("cache", "prune", "--cache", str(filled), "--yes", *flags), msg)
    assert snapshot(filled) == before
    assert not missing.exists() and os.listdir(other) == ["f"]


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


@pytest.mark.slow
def test_warming_from_a_pool_rebuilds_exactly_the_trees_rollout_built(tmp_path):
    """`srt rollout` (no run-ahead) fills its cache while sampling; `srt cache add` of the pool
    it wrote must produce byte-identical trees under the same uids (same prompt encoding,
    fingerprint, anchor token and response span)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from cache_store.codec import decode_record

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
    a, b = CacheStore.open(tmp_path / "c1"), CacheStore.open(tmp_path / "c2")
    try:
        uids = sorted(u for u, _, _ in a.scan())
        assert len(uids) == 3 and uids == sorted(u for u, _, _ in b.scan())
        for u in uids:  # compare the stored node tables (rollout's clock has ticked, so no decay)
            assert decode_record(a.raw_record(u))[1] == decode_record(b.raw_record(u))[1]
    finally:
        a.close()
        b.close()


def test_drafting_skips_a_corrupt_tree_and_goes_on(filled):
    """The rollout drafter on a cache with a flipped byte: that prompt drafts from an empty
    tree (with a warning), the others still draft, nothing crashes."""
    from types import SimpleNamespace

    from cache_store.errors import CorruptTreeWarning
    from srtcli.rollout.drafters.srt import SrtDrafter

    bad, good = prompt_uid([3], "fp"), prompt_uid([4], "fp")
    s = CacheStore.open(filled)
    rec = bytearray(s.raw_record(bad))
    rec[30] ^= 0x01
    with s.env.begin(write=True) as txn:
        txn.put(bad.encode(), bytes(rec), db=s.handle().dbs["trees"])
    d = SrtDrafter(s)
    seqs = [SimpleNamespace(group=u, runahead=False, prompt_ids=[p], output=[], drafter_state=None)
            for u, p in ((bad, 3), (good, 4))]
    with pytest.warns(CorruptTreeWarning, match=bad):
        d.begin(seqs[0])
    d.begin(seqs[1])
    assert d.propose(seqs[0], 8).tokens == []
    assert len(d.propose(seqs[1], 8).tokens) > 0
    assert d.stats()["cache_hits"] == 1
    s.close()


def test_prune_compact_refuses_up_front_while_another_process_uses_the_cache(filled):
    code = ("import time; from cache_store.store import CacheStore; "
            f"s = CacheStore.open({str(filled)!r}); print('open', flush=True); time.sleep(60)")
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
