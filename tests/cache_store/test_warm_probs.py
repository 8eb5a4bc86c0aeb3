"""`pool_rollouts` gives a trajectory's p-hat (exp of old_logprobs where a step trains the token,
0 for tool output) only when every step says it was sampled and no step is missing; the
`Warmer` stores it with the anchor unknown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cache_store.seqstore import LmdbSequenceStore
from cache_store.uid import prompt_uid
from cache_store.warm import Warmer, pool_rollouts

T1 = {"temperature": 1.0}


@dataclass
class Step:
    """A steps-pool record as `pool_rollouts` reads one (`cache_store.warm.StepLike`)."""

    prompt_uid: str
    trajectory_id: str
    step: int
    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    meta: dict[str, Any]


def two_turns(meta0=T1, meta1=T1) -> list[Step]:
    """Prompt [3, 4]; turn 0 generates [5, 6], the tool answers [7], turn 1 generates [8];
    the steps arrive last first."""
    return [Step("p", "t", 1, [3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 1], [0.0] * 5 + [-2.0], dict(meta1)),
            Step("p", "t", 0, [3, 4, 5, 6], [0, 0, 1, 1], [0.0, 0.0, -0.5, -1.0], dict(meta0))]


def test_every_turn_gives_its_tokens_probabilities_and_tool_output_gets_zero():
    [(prompt, response, probs)] = list(pool_rollouts(two_turns()))
    assert (prompt, response) == ([3, 4], [5, 6, 7, 8])
    np.testing.assert_allclose(probs, [math.exp(-0.5), math.exp(-1.0), 0.0, math.exp(-2.0)], rtol=1e-6)


def test_no_probabilities_unless_every_step_was_sampled_and_present():
    greedy = {"temperature": 0.0}
    cases = {
        "greedy": two_turns(greedy, greedy),
        "one greedy step": two_turns(T1, greedy),
        "no temperature": two_turns({}, {}),
        "a bool is no temperature": two_turns({"temperature": True}, {"temperature": True}),
        "a missing step": two_turns()[:1],
    }
    for name, steps in cases.items():
        [(_, _, probs)] = list(pool_rollouts(steps))
        assert probs is None, name


def test_warmer_stores_the_anchor_unknown_then_the_responses_probabilities(tmp_path):
    with LmdbSequenceStore.open(tmp_path / "c") as store:
        w = Warmer(store, "fp")
        for prompt, response, probs in pool_rollouts(two_turns()):
            w.add(prompt, response, probs)
        w.add([3, 4], [9], None)  # a rollout without them, same prompt
        w.flush()
        assert (w.sequences, w.with_probs) == (2, 1)
        [a, b] = store.read(prompt_uid([3, 4], "fp"))
    assert a.tokens.tolist() == [4, 5, 6, 7, 8] and b.tokens.tolist() == [4, 9] and b.probs is None
    assert math.isnan(a.probs[0])
    np.testing.assert_allclose(a.probs[1:], [math.exp(-0.5), math.exp(-1.0), 0.0, math.exp(-2.0)], atol=1 / 508)
