"""Every JSONL input (prompts, steps pools, `cache add` rollouts) is split and decoded the same way:
lines end at `\\n` only, a leading UTF-8 BOM is accepted, and bytes that are not UTF-8 are a
one-line error naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from srtcli.cli import cli
from srtcli.errors import SrtError
from srtcli.jsonl import read_lines
from srtcli.models import default_model_dir
from srtcli.pool import StepRecord, read_pool
from srtcli.rollout.prompts import read_prompts
from srtcli.tokenizers import encode_prompt, load_tokenizer

BOM = b"\xef\xbb\xbf"
SEPARATORS = "\u2028\u2029\u0085"  # str.splitlines() ends a line at each; JSON strings may hold them raw


def jsonl(*records: dict) -> bytes:
    """Lines as `ensure_ascii=False` writers produce them: separators stay raw in strings."""
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_model_dir())


def one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_lines_end_at_newline_only_and_a_bom_is_dropped(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_bytes(BOM + jsonl({"t": f"a{SEPARATORS}b"}, {"t": "c"}) + b'{"t": "d"}\r\n')
    got = [(n, json.loads(text)["t"]) for n, text in read_lines(f)]
    assert got == [(1, f"a{SEPARATORS}b"), (2, "c"), (3, "d")]


def test_bad_utf8_names_file_and_line(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_bytes(jsonl({"t": "ok"}, {"t": "ok"}) + b'{"t": "\xff"}\n')
    with pytest.raises(SrtError, match=r"a\.jsonl:3: not UTF-8 text \(byte 0xff at column 8\)"):
        list(read_lines(f))


def test_prompts_with_raw_separators_and_a_bom(tmp_path, tok):
    text = f"What is 2{SEPARATORS}+2?"
    f = tmp_path / "p.jsonl"
    f.write_bytes(BOM + jsonl({"id": "a", "prompt": text, "answer": "4"}, {"id": "b", "prompt": "What is 3+3?"}))
    got = read_prompts(f, tok, 10_000)
    assert [(p.line, p.id, p.record["prompt"]) for p in got] == [(1, "a", text), (2, "b", "What is 3+3?")]
    assert got[0].ids == encode_prompt(tok, text)
    f.write_bytes(jsonl({"prompt": "x"}) + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(SrtError, match=r"p\.jsonl:2: not UTF-8"):
        read_prompts(f, tok, 10_000)


def step(i: int, note: str) -> dict:
    return StepRecord(f"p{i}", f"t{i}", 0, [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25], 1.0, meta={"note": note}).__dict__


@pytest.mark.parametrize("zst", [False, True])
def test_pool_files_with_raw_separators_a_bom_and_bad_bytes(tmp_path, zst):
    pool = tmp_path / "pool"
    pool.mkdir()
    name = "a.jsonl.zst" if zst else "a.jsonl"
    pack = zstandard.ZstdCompressor().compress if zst else (lambda b: b)
    (pool / name).write_bytes(pack(BOM + jsonl(step(0, f"x{SEPARATORS}y"), step(1, "z"))))
    assert [s.meta["note"] for s in read_pool(pool)] == [f"x{SEPARATORS}y", "z"]
    (pool / name).write_bytes(pack(jsonl(step(0, "x")) + b"\x80\n"))
    with pytest.raises(SrtError, match=rf"{name}:2: not UTF-8"):
        read_pool(pool)
    r = CliRunner().invoke(cli, ["pack", "--steps", str(pool), "--out", str(tmp_path / "shards")])
    one_line_error(r, f"{name}:2: not UTF-8")
    assert not (tmp_path / "shards").exists()


def test_cache_add_reads_rollouts_the_same_way(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_bytes(BOM + jsonl({"prompt_ids": [7, 8], "response_ids": [1, 2]}, {"prompt_ids": [7, 9], "response_ids": [3]}))
    r = CliRunner().invoke(cli, ["cache", "add", str(src), "--cache", str(tmp_path / "c"), "--tokenizer-fingerprint", "fp", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["rollouts"] == 2
    src.write_bytes(jsonl({"prompt_ids": [7, 8], "response_ids": [1, 2]}) + b'{"prompt_ids": [1], "x": "\xc3"}\n')
    r = CliRunner().invoke(cli, ["cache", "add", str(src), "--cache", str(tmp_path / "d"), "--tokenizer-fingerprint", "fp"])
    one_line_error(r, "r.jsonl:2: not UTF-8")
    assert not (tmp_path / "d").exists()
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "a.jsonl").write_bytes(BOM + jsonl(step(0, f"x{SEPARATORS}y")))
    r = CliRunner().invoke(cli, ["cache", "add", str(pool / "a.jsonl"), "--cache", str(tmp_path / "e"),
                                 "--tokenizer-fingerprint", "fp", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["rollouts"] == 1
