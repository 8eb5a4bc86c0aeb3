"""How the SRT proposer recognises which sequence each row of vLLM's batch holds, step after
step: the tracked sequence and the vectorised tests `tree_drafts.TreeDrafts` applies to a whole
batch (no vLLM import, so they are tested directly).

The hook passes no request ids, and rows move (vLLM condenses its batch), so each row's
sequence is recognised by its tokens, reading only what a step changed: a row continues a
sequence it tracked if it holds exactly what the sequence had plus this step's sampled tokens
(a done one: at least what it had) and the same `TAIL` tokens before that length (one gather
for the whole batch); otherwise it is a sequence that moved there, one that left the batch and
came back (vLLM drops a request it preempts or skips for a step; it returns holding exactly
what it held plus this step's tokens), or a new one, whose prompt is what its row held before
its first sampled tokens. A sequence out of the batch may come back for `PARK_STEPS` steps;
then it ends.

A driver that runs tools (`srt rollout --engine vllm --tools`) sends each model turn of a
trajectory as its own request, named by `turn_request_id` (the prompt's uid, the sample, the
prompt's length, the turn). The proposer reads the ids of new rows only (`parse_turn_request`):
a turn's row is the trajectory's sequence, its prompt the original prompt (not the conversation
so far), and a later turn continues the sequence the earlier one fed, taking the tool output
between them as what the model reads. A trajectory's sequence is parked between turns (not
ended at a turn's eos) until the driver's `srt_finish`.

A step's row state is a few arrays in row order (`slots`, `seen`, `done`, `tails`, and the
drafting state), carried to the next step by index (`TreeDrafts._track`'s `src`), so a step
touches no Python object per row that kept its sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cache_store.store import TREE_DEPTH
from srtcli.rollout.drafters.prompt_trees import PromptTree

# tokens before a row's known length that recognise it (with the length) next step: as many as a
# draft reads, so only rows that end alike as far as a draft looks can be taken for each other
TAIL = TREE_DEPTH
PARK_STEPS = 256  # steps a sequence out of the batch may still come back as itself
TURN_PREFIX = "srt-turn:"


@dataclass
class TrackedSeq:
    """One sequence the proposer tracks: its prompt group, what it has fed, and its drafting
    state. While a row holds it, that state (`seen` to `done`) lives in the proposer's arrays, a
    column per row, and these fields are stale; they hold it again from the step its row loses
    it (`_park`) until a row takes it up again."""

    uid: str
    plen: int
    seen: int  # tokens of the row inserted (or skipped) so far: the row's length last step
    streams: tuple  # the group tree's stream first, then the run-wide tree's
    cores: tuple  # their compiled streams, for the batched calls
    group: PromptTree  # its own reference: a sequence of a group no longer in memory can still draft
    tail: Any = None  # the row's last `TAIL` tokens before `seen` (what recognises the row)
    last_draft: list = field(default_factory=list)  # what we proposed for the next step
    spec_len: int = -1  # adaptive draft length (-1: not started, = budget)
    done: bool = False  # eos or max_new_tokens reached: it takes no more tokens
    ended: bool = False  # committed (or waiting to be)
    early: bool = False  # ended by an idle commit before it was done: its row may still come back
    left: int = -1  # the step it left the batch at, while it may come back
    trajectory: str | None = None  # the driver's trajectory key (its turns are requests of their own)


def gather_tails(ids: np.ndarray, slots: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Per row, the `TAIL` tokens of `ids[slot]` just before its `seen` (positions clipped at 0),
    gathered at once. Rows at least `TAIL` long (a production batch: prompts alone are longer)
    take whole windows of the flat buffer, a fifth of the cost of gathering token by token
    (`ids.reshape(-1)` is a view of vLLM's C-contiguous `token_ids_cpu`)."""
    flat, width = np.ascontiguousarray(ids).reshape(-1), ids.shape[1]
    if len(seen) and int(seen.min()) >= TAIL:
        windows = np.ndarray((len(flat) - TAIL + 1, TAIL), flat.dtype, flat, 0, flat.strides * 2)  # a view
        windows.flags.writeable = False  # (np.ndarray, not as_strided: a fifth of its 5 us)
        return windows[slots * width + seen - TAIL]
    return flat[np.maximum(seen[:, None] - TAIL + np.arange(TAIL), 0) + np.reshape(slots * width, (-1, 1))]


def tail_of(window: np.ndarray, start: int, seen: int) -> np.ndarray | None:
    """The `TAIL` tokens before `seen` of a sequence whose tokens from `start` on are `window`,
    as `gather_tails` takes them (positions clipped at 0); None if the window does not hold them."""
    pos = np.maximum(seen - TAIL + np.arange(TAIL), 0) - start
    return window[pos] if pos.min() >= 0 and seen - start <= len(window) else None


def grown(seen: Any, done: Any, n: Any, k: Any) -> Any:
    """Whether a row `n` long that sampled `k` tokens is as long as a sequence `seen` long would
    be now: exactly what it had and those (a longer identical sibling, as greedy samples are, is
    not it); a done one at least what it had (it may hold junk after eos). Scalars or arrays."""
    return np.where(done, n >= seen, n - k == seen)


def turn_request_id(uid: str, sample: int, prompt_len: int, turn: int) -> str:
    """The vLLM request id of turn `turn` (0, 1, ...) of sample `sample` of the prompt `uid`
    whose first `prompt_len` tokens are the prompt."""
    return f"{TURN_PREFIX}{uid}:{sample}:{prompt_len}:{turn}"


def parse_turn_request(request_id: str) -> tuple[str, int] | None:
    """(trajectory key, prompt length) of a `turn_request_id` (vLLM may append its own suffix),
    or None for any other request."""
    if not request_id.startswith(TURN_PREFIX):
        return None
    parts = request_id[len(TURN_PREFIX):].split(":")
    if len(parts) < 4 or not parts[2].isdigit():
        return None
    return f"{parts[0]}:{parts[1]}", int(parts[2])
