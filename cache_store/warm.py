"""Warming a cache from rollouts that already exist (`srt cache add`).

Two sources, both reduced to (prompt ids, response ids) pairs:
- rollout JSONL lines (`parse_rollout_line`): token ids (`prompt_ids`, `response_ids`, and
  optionally `response_logprobs`: the policy's log-prob of each response token as it was
  sampled, null where it did not sample it, which gives p-hat) or text (`prompt` as a string
  or chat messages, `response`), which the caller tokenizes;
- steps-pool trajectories (`pool_rollouts`): the prompt is the first step's tokens before
  its first trained token, the response everything after the prompt in the last step. A
  trajectory whose steps all say they were sampled (`meta.temperature` > 0, as `srt rollout`
  writes) and are all there (steps 0 to the last) also gives each response token's
  probability under the policy that sampled it (p-hat, exp of its `old_logprobs` in the step
  that trained it; 0 for tool output, which is never drafted), stored with the sequence as
  `srt rollout` stores it. Greedy steps (old_logprobs 0.0: no probability) and pools that do
  not say give none.

`Warmer` appends each rollout to the sequence store under its prompt's uid, as the sequence
the rollout drafter (srtcli.rollout.drafters.srt) stores: the prompt's last token (the
anchor), then the response, so a loaded tree has exactly the shape rollouts build and a
sample can be drafted from its first token. It gathers sequences and writes them with
`append_many` in batches of about `batch_tokens` stored tokens, so memory stays bounded on
large inputs, and never advances the logical clock (warmed rollouts weigh 1 at the current
tick, as if a rollout had just written them).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

import numpy as np

from cache_store.store import SequenceStore
from cache_store.uid import prompt_uid

MAX_TOKEN_ID = 2**31 - 1  # the tree's limit


@dataclass
class RolloutLine:
    """One JSONL rollout: ids, or text still to tokenize (exactly one of the two is set)."""

    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    prompt: str | list[dict[str, str]] | None = None
    response: str | None = None
    probs: np.ndarray | None = None  # p-hat of each response token (NaN: unknown), with ids only


def _ids(d: dict, key: str, allow_empty: bool) -> list[int]:
    ids = d.get(key)
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"`{key}` must be a list of integers")
    if not ids and not allow_empty:
        raise ValueError(f"`{key}` must not be empty")
    if any(t < 0 for t in ids):
        raise ValueError(f"`{key}` has a negative token id")
    if any(t > MAX_TOKEN_ID for t in ids):
        raise ValueError(f"`{key}` has a token id above {MAX_TOKEN_ID}")
    return ids


def _p_hat(logprobs: np.ndarray) -> np.ndarray:
    """Probabilities from log-probs (NaN stays unknown); a log-prob rounded just above 0 gives 1."""
    return np.minimum(np.exp(logprobs), 1.0)


def _probs(d: dict, n: int) -> np.ndarray | None:
    """p-hat from `response_logprobs` (numbers <= 0 or null, one per response token), if given."""
    lps = d.get("response_logprobs")
    if lps is None:
        return None
    if not isinstance(lps, list) or not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))
                                            for x in lps):
        raise ValueError("`response_logprobs` must be a list of numbers (null where unknown)")
    if len(lps) != n:
        raise ValueError(f"`response_logprobs` must hold one value per response token ({n}), not {len(lps)}")
    a = np.array([np.nan if x is None else x for x in lps], dtype=np.float64)
    if (a[~np.isnan(a)] > 1e-6).any() or np.isinf(a).any():
        raise ValueError("`response_logprobs` must be finite log-probabilities (<= 0)")
    return None if np.isnan(a).all() else _p_hat(a)


def _messages(prompt: Any) -> list[dict[str, str]]:
    if not prompt:
        raise ValueError("`prompt` must not be an empty list")
    for m in prompt:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError("`prompt` messages must be objects with string `role` and `content`")
    return prompt


def parse_rollout_line(text: str) -> RolloutLine:
    """Parse and validate one JSONL line; raises ValueError with a short reason."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise ValueError("a rollout must be a JSON object")
    if "prompt_ids" in d or "response_ids" in d:
        response = _ids(d, "response_ids", True)
        return RolloutLine(prompt_ids=_ids(d, "prompt_ids", False), response_ids=response,
                           probs=_probs(d, len(response)))
    if "response_logprobs" in d:
        raise ValueError("`response_logprobs` needs `response_ids` (a text response is tokenized again)")
    if "prompt" not in d or "response" not in d:
        raise ValueError("a rollout needs `prompt_ids` and `response_ids`, or `prompt` and `response`")
    prompt, response = d["prompt"], d["response"]
    if isinstance(prompt, list):
        prompt = _messages(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise ValueError("`prompt` must be a non-empty string or a list of chat messages")
    if not isinstance(response, str):
        raise ValueError("`response` must be a string")
    return RolloutLine(prompt=prompt, response=response)


class StepLike(Protocol):
    """What `pool_rollouts` needs of a steps-pool record (srtcli.pool.StepRecord)."""

    prompt_uid: str
    trajectory_id: str
    step: int
    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    meta: dict[str, Any]


class _Probs:
    """One trajectory's p-hat, gathered from its steps in any order."""

    def __init__(self) -> None:
        self.p = np.zeros(0, np.float32)  # 0 where no step trains the token (tool output)
        self.steps: set[int] = set()
        self.sampled = True

    def take(self, s: StepLike) -> None:
        t = s.meta.get("temperature")
        self.sampled = self.sampled and isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
        self.steps.add(s.step)
        if not self.sampled:
            return
        if self.p.size < len(s.input_ids):
            self.p = np.concatenate([self.p, np.zeros(len(s.input_ids) - self.p.size, np.float32)])
        trained = np.flatnonzero(np.asarray(s.loss_mask, dtype=bool))
        self.p[trained] = _p_hat(np.asarray(s.old_logprobs, dtype=np.float64)[trained])

    def of(self, start: int, end: int) -> np.ndarray | None:
        """p-hat of tokens [start, end), or None unless every step was there and sampled."""
        if not self.sampled or self.steps != set(range(max(self.steps) + 1)):
            return None
        return self.p[start:end]


def pool_rollouts(steps: Iterable[StepLike]) -> Iterator[tuple[list[int], list[int], np.ndarray | None]]:
    """(prompt ids, response ids, the response's p-hat or None) of every trajectory in a stream
    of steps (any order)."""
    first: dict[tuple[str, str], tuple[int, array]] = {}
    last: dict[tuple[str, str], tuple[int, array]] = {}
    probs: dict[tuple[str, str], _Probs] = {}
    for s in steps:
        key = (s.prompt_uid, s.trajectory_id)
        if key not in first or s.step < first[key][0]:
            cut = s.loss_mask.index(1) if 1 in s.loss_mask else len(s.input_ids)
            first[key] = (s.step, array("i", s.input_ids[:cut]))
        if key not in last or s.step > last[key][0]:
            last[key] = (s.step, array("i", s.input_ids))
        probs.setdefault(key, _Probs()).take(s)
    for key, (_, prompt) in first.items():
        whole = last[key][1]
        yield prompt.tolist(), whole[len(prompt):].tolist(), probs[key].of(len(prompt), len(whole))


class Warmer:
    """Append rollouts (anchor + response) to a sequence store in token-bounded batches."""

    def __init__(self, store: SequenceStore, tokenizer_fingerprint: str, batch_tokens: int = 2_000_000):
        self.store = store
        self.fingerprint = tokenizer_fingerprint
        self.batch_tokens = batch_tokens
        self._batch: dict[str, list[list[int]]] = {}
        self._probs: dict[str, list[np.ndarray | None]] = {}
        self._pending = 0
        self.rollouts = 0
        self.sequences = 0
        self.with_probs = 0  # sequences stored with p-hat
        self.tokens = 0
        self.batches = 0
        self.uids: set[str] = set()

    def add(self, prompt_ids: list[int], response_ids: list[int], probs: Any = None) -> str:
        """Count one rollout; returns its prompt uid. Writes when the batch is full. `probs`:
        p-hat of each response token, if known (the anchor's is unknown).

        An empty response is counted (its prompt is one of the prompts seen) but stores
        nothing: a rollout that generated nothing has nothing to draft from.
        """
        uid = prompt_uid(prompt_ids, self.fingerprint)
        self.rollouts += 1
        self.uids.add(uid)
        if response_ids:
            seq = prompt_ids[-1:] + list(response_ids)  # the anchor, then the response
            self._batch.setdefault(uid, []).append(seq)
            self._probs.setdefault(uid, []).append(None if probs is None else np.concatenate([[np.nan], probs]))
            self.with_probs += probs is not None
            self.sequences += 1
            self.tokens += len(response_ids)
            self._pending += len(seq)
            if self._pending >= self.batch_tokens:
                self.flush()
        return uid

    def flush(self) -> None:
        """Append the sequences gathered so far (one write transaction)."""
        if self._batch:
            self.store.append_many(self._batch, self._probs)
            self.batches += 1
        self._batch, self._probs = {}, {}
        self._pending = 0
