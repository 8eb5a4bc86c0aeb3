"""Agent rollouts on vLLM: each model turn of a trajectory is a vLLM request of its own.

A trajectory follows the embedded engine's rules, in the same code: `srtcli.rollout.engine.stops`
(where a turn's tokens stop, how a turn ends, how tool output joins the trajectory) over the
engine's `Sequence`, and `srtcli.rollout.agent.hooks.AgentHooks` (the call format, the tools on
their worker threads, the limits). Only how a turn is generated differs: `TurnLoop` drives vLLM's
`LLMEngine` step by step (`add_request` / `step`). A turn is one request holding the whole
trajectory so far; vLLM stops it at eos, at any token where the call format may end a call
(`AgentHooks.candidates`: eos for chat-template calls; for `<calc>` tags every token with a `>`)
or at the token budget, and `cut_emitted` decides as the embedded engine does: a stop that ends
no call continues the turn as a new request. A turn that calls tools leaves vLLM's batch while its
calls run; the other trajectories keep generating; when the results are in, the trajectory comes
back as a new request continuing its token ids (prefix caching: its context is not recomputed).

At most `slots` requests are in vLLM at once, returning trajectories first, so one coming back
from its tools does not queue behind the batch's fresh samples. Requests are named by
`row_tracking.turn_request_id`, which the SRT proposer reads to draft every turn of a trajectory
from its prompt's tree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from srtcli.rollout.agent.hooks import AgentHooks
from srtcli.rollout.engine.sequence import Sequence
from srtcli.rollout.engine.stops import WAIT_S, append_generated, cut_emitted, end_turn, take_tool_output
from srtcli.rollout.vllm.row_tracking import turn_request_id

# (trajectory, its request number, stop token ids, max tokens) -> vLLM SamplingParams
ParamsFor = Callable[[Sequence, int, list[int], int], Any]


class TurnLoop:
    """Trajectories through one `vllm.LLM`: `run` returns when every one has finished."""

    def __init__(self, llm: Any, hooks: AgentHooks, params_for: ParamsFor, max_len: int, eos_ids: set[int],
                 slots: int, greedy: bool):
        self.engine, self.hooks, self.params_for = llm.llm_engine, hooks, params_for
        self.max_len, self.eos_ids, self.slots, self.greedy = max_len, set(eos_ids), slots, greedy
        self.stops = sorted(hooks.candidates)
        self.requests = 0  # requests sent (turns, and turns continued)
        self.steps = 0  # vLLM engine steps (one forward each) while this loop had requests in vLLM

    def run(self, seqs: list[Sequence]) -> Iterator[Sequence]:
        """Every trajectory of `seqs` (in the order they start) to its end; yields each as it finishes."""
        queue: deque[Sequence] = deque(seqs)
        running: dict[str, Sequence] = {}
        waiting: list[Sequence] = []
        while queue or running or waiting:
            finished: list[Sequence] = []
            for seq in self._back_from_tools(waiting):
                if seq.finish_reason is not None:
                    finished.append(seq)
                else:
                    queue.appendleft(seq)
            while queue and len(running) < self.slots:
                seq = queue.popleft()
                running[self._submit(seq)] = seq
            if running:
                self.steps += 1
                for out in self.engine.step():
                    if out.finished:
                        self._turn_done(running.pop(out.request_id), out.outputs[0], queue, waiting, finished)
            elif waiting:
                waiting[0].pending.wait(WAIT_S)
            yield from finished

    def _submit(self, seq: Sequence) -> str:
        """Send the trajectory's next turn (or the rest of its turn): all its tokens as the prompt."""
        n = seq.meta.setdefault("requests", 0)
        seq.meta["requests"] = n + 1
        self.requests += 1
        rid = turn_request_id(seq.group, seq.meta["sample"], len(seq.prompt_ids), n)
        left = min(seq.max_new_tokens - seq.generated, self.max_len - len(seq.tokens))  # as `cut_emitted` bounds it
        self.engine.add_request(rid, {"prompt_token_ids": list(seq.tokens)}, self.params_for(seq, n, self.stops, left))
        return rid

    def _turn_done(self, seq: Sequence, completion: Any, queue: deque, waiting: list,
                   finished: list[Sequence]) -> None:
        """vLLM stopped a turn: keep its tokens by the stop rules, then end the turn (tools) or go on."""
        emitted = list(completion.token_ids)
        lps = [0.0] * len(emitted) if self.greedy else \
            [float(d[t].logprob) for d, t in zip(completion.logprobs, emitted)]
        cut, reason = cut_emitted(seq, emitted, self.eos_ids, self.hooks.stop, self.max_len)
        append_generated(seq, emitted, lps, cut)
        if reason is not None:
            reason = end_turn(seq, reason, self.hooks.turn_end, self.max_len, None)
            if reason is not None:
                seq.finish_reason = reason
                finished.append(seq)
                return
        if seq.pending is not None:
            waiting.append(seq)
        else:
            queue.appendleft(seq)  # its next turn (tool output appended), or the rest of this one

    def _back_from_tools(self, waiting: list[Sequence]) -> list[Sequence]:
        """The waiting trajectories whose tool output is ready, with it appended (or finished)."""
        back = []
        for seq in list(waiting):
            ready, reason = take_tool_output(seq, self.max_len, None)
            if ready:
                waiting.remove(seq)
                seq.finish_reason = reason
                back.append(seq)
        return back
