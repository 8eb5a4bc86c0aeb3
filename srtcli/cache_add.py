"""Warming the cache from rollouts that already exist (what `srt cache add` does).

SOURCE is a steps pool (a directory, a `.zst` file, or a file whose first line is a step) or a
rollout JSONL file of token ids or of text (cache_store.warm reads both). Two passes, so bad
input is found before the cache is touched: the first validates every line (and every token id
against the tokenizer's vocabulary) and settles which tokenizer fingerprint the trees belong
under; only then is the cache opened and the second pass appends each rollout (the prompt's last
token, then the response) in batches bounded by tokens. Every error is an
`SrtError` naming the file (and line). Nothing heavy is imported unless `--model` loads a
tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from cache_store.warm import RolloutLine, Warmer, parse_rollout_line, pool_rollouts
from srtcli.store_link import open_store
from srtcli.errors import SrtError, at
from srtcli.jsonl import read_lines
from srtcli.pool import StepRecord, iter_steps
from srtcli.progress import progress


def _sniff_pool(source: Path) -> bool:
    """Whether SOURCE is a steps pool: a directory, or a file whose first line is a step."""
    if source.is_dir():
        return True
    if source.name.endswith(".zst"):
        return True
    try:
        for _, text in read_lines(source):
            if text.strip():
                try:
                    d = json.loads(text)
                except json.JSONDecodeError:
                    return False
                return isinstance(d, dict) and "input_ids" in d and "loss_mask" in d
    except SrtError:  # not UTF-8: the rollout reader reports the line
        return False
    return False


def _check_vocab(ids: list[int], vocab: int | None) -> None:
    if vocab is not None and ids and max(ids) >= vocab:
        raise ValueError(f"token id {max(ids)} is outside the tokenizer's vocabulary (size {vocab})")


def _rollout_lines(source: Path, skip_bad: bool, stats: dict, vocab: int | None) -> Iterator[tuple[int, RolloutLine]]:
    """(line number, RolloutLine) of a rollout JSONL file; bad lines raise or are counted."""
    for lineno, text in read_lines(source):
        if not text.strip():
            continue
        try:
            r = parse_rollout_line(text)
            if r.prompt_ids is not None:
                _check_vocab(r.prompt_ids + r.response_ids, vocab)
            yield lineno, r
        except ValueError as e:
            if not skip_bad:
                raise at(source, lineno, str(e)) from None
            stats["skipped"] += 1


def _tokenized(source: Path, tok: Any, skip_bad: bool) -> Iterator[tuple[list[int], list[int], Any]]:
    """(prompt ids, response ids, p-hat or None) per good line; text lines go through the
    tokenizer (and have no p-hat)."""
    from srtcli.tokenizers import encode_prompt, encode_response

    for lineno, r in _rollout_lines(source, skip_bad, {"skipped": 0}, _vocab(tok)):
        if r.prompt_ids is not None:
            yield r.prompt_ids, r.response_ids, r.probs
            continue
        try:
            yield encode_prompt(tok, r.prompt), encode_response(tok, r.response), None
        except Exception as e:  # a template that rejects these messages: the line is at fault
            raise at(source, lineno, f"cannot tokenize: {type(e).__name__}: {e}") from None


def _tokenizer(model: str | None, given: str | None) -> tuple[Any, str | None]:
    """(tokenizer or None, fingerprint or None) from --model / --tokenizer-fingerprint."""
    from srtcli.tokenizers import load_tokenizer, tokenizer_fingerprint

    if model is None:
        return None, given or None
    tok = load_tokenizer(model)
    fp = tokenizer_fingerprint(tok)
    if given and given != fp:
        raise SrtError(f"--tokenizer-fingerprint {given} differs from {model}'s ({fp})")
    return tok, fp


def _vocab(tok: Any) -> int | None:
    return None if tok is None else len(tok)


def _need(tok: Any, fp: str | None, needs_text: bool) -> str:
    if needs_text and tok is None:
        raise SrtError("text rollouts need --model (its tokenizer and chat template)")
    if fp is None:
        raise SrtError("token ids need --model or --tokenizer-fingerprint so trees land under the right tokenizer")
    return fp


def _pool_checked(source: Path, steps: Iterator[StepRecord], vocab: int | None) -> Iterator[StepRecord]:
    for s in steps:
        try:
            _check_vocab(s.input_ids, vocab)
        except ValueError as e:
            raise SrtError(f"{source}: trajectory {s.trajectory_id} step {s.step}: {e}") from None
        yield s


def _refuse_empty(source: Path, any_good: bool, skipped: int) -> None:
    """Nothing to add is an error, as for `srt rollout` and `srt pack` (before the cache opens)."""
    if not any_good:
        why = f"every line was bad: {skipped} skipped" if skipped else "it is empty"
        raise SrtError(f"{source}: no rollouts to add ({why})")


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _validated(source: Path, pool: bool, tok: Any, fp: str | None, skip_bad: bool,
               stats: dict) -> tuple[Iterator, str]:
    """Pass 1: (the (prompt ids, response ids, p-hat or None) to insert, the fingerprint to file
    them under)."""
    if pool:
        rollouts = pool_rollouts(_pool_checked(source, iter_steps(source, skip_bad, stats), _vocab(tok)))
        first = next(rollouts, None)  # consumes and validates the whole pool
        _refuse_empty(source, first is not None, stats["skipped"])
        return _chain(first, rollouts), _need(tok, fp, needs_text=False)
    needs_text, good = False, 0
    for _, r in _rollout_lines(source, skip_bad, stats, _vocab(tok)):
        needs_text, good = needs_text or r.prompt_ids is None, good + 1
    _refuse_empty(source, good > 0, stats["skipped"])
    fp = _need(tok, fp, needs_text)
    return _tokenized(source, tok, skip_bad), fp


def add_rollouts(source: Path, model: str | None = None, fingerprint: str | None = None, skip_bad: bool = False,
                 cache_dir: str | None = None, half_life: float | None = None, floor: float | None = None,
                 as_json: bool = False) -> dict[str, Any]:
    """Validate SOURCE fully (pass 1), then append in batches (pass 2); returns the figures
    `srt cache add` prints: cache, rollouts, sequences (those with a response), with_probs (those
    stored with p-hat), tokens (of the responses), trees (= prompts), skipped,
    tokenizer_fingerprint."""
    if not source.exists():
        raise SrtError(f"{source}: no such file or directory")
    stats = {"skipped": 0}
    pool = _sniff_pool(source)
    tok, fp = _tokenizer(model, fingerprint)
    items, fp = _validated(source, pool, tok, fp, skip_bad, stats)
    settings = {k: v for k, v in (("half_life", half_life), ("floor", floor)) if v is not None}
    with open_store(cache_dir, create=True, **settings) as store:
        warmer = Warmer(store, fp)
        with progress("adding rollouts", as_json=as_json) as bar:
            for prompt_ids, response_ids, probs in items:
                warmer.add(prompt_ids, response_ids, probs)
                bar.advance()
        warmer.flush()
        where = str(store.path)
    return {"cache": where, "rollouts": warmer.rollouts, "sequences": warmer.sequences,
            "with_probs": warmer.with_probs, "tokens": warmer.tokens,
            "trees": len(warmer.uids), "prompts": len(warmer.uids),
            "skipped": stats["skipped"], "tokenizer_fingerprint": fp}
