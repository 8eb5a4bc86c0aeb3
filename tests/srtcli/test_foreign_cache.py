"""Every command that takes `--cache` refuses a foreign LMDB with one line and leaves it byte for
byte as it was (no `srt.lock`, LMDB's lock file untouched); `srt rollout` refuses a cache of the
earlier tree format the same way, naming `srt cache add` (the way to rebuild it)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from srtcli.cli import cli
from tests.cache_store.support import dir_digest as digest
from tests.cache_store.support import foreign_lmdb, old_format_cache


def test_commands_refuse_a_foreign_lmdb_without_writing_to_it(tmp_path):
    foreign = foreign_lmdb(tmp_path / "foreign")
    before = digest(foreign)
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text(json.dumps({"prompt_ids": [1, 2], "response_ids": [3]}) + "\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2+2?"}) + "\n")
    for args in (["cache", "stats"], ["cache", "prune", "--max-trees", "1", "--yes"],
                 ["cache", "add", str(rollouts), "--tokenizer-fingerprint", "fp"],
                 ["cache", "export", str(tmp_path / "exp")],
                 ["rollout", "--prompts", str(prompts), "-n", "1", "--out", str(tmp_path / "pool")]):
        r = CliRunner().invoke(cli, [*args, "--cache", str(foreign)])
        assert r.exit_code == 1, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and "not an srt cache" in lines[0], (args, r.output)
        assert digest(foreign) == before, args
    assert not (tmp_path / "exp").exists() and not (tmp_path / "pool").exists()


def test_rollout_refuses_an_earlier_format_cache_before_writing_anything(tmp_path):
    old = old_format_cache(tmp_path / "old")
    before = digest(old)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2+2?"}) + "\n")
    r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "-n", "1", "--out", str(tmp_path / "pool"),
                                 "--cache", str(old)])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "earlier tree format" in lines[0] and "srt cache add" in lines[0], r.output
    assert str(old) in lines[0]
    assert digest(old) == before and not (tmp_path / "pool").exists()
