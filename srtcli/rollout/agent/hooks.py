"""The embedded engine's tool hooks for one run: where a model turn ends in a tool call, what the
row gets back, and the per-trajectory tool sessions.

`AgentHooks.stop` ends a turn where the call format says a call is complete (at the eos for
chat-template calls, at `</calc>` for the bundled tag format); `turn_end` parses the turn's
calls, runs them through the `ToolRunner` (a pending `ToolTurn`, or tokens at once) and renders
the results, each cut to `max_tool_tokens` tokens, as the untrained tokens of the next turn. A
trajectory has at most `max_turns` model turns (finish reason `max_turns` when its last one still
called a tool). Run-ahead rows never run tools: their turn ends at the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srtcli.rollout.agent.formats import CallFormat
from srtcli.rollout.agent.runner import ToolRunner
from srtcli.rollout.agent.toolset import ToolCall, ToolSession, ToolSet

TRUNCATED = " ...[truncated]"
# A stop candidate is screened on the text of the turn's last TAIL_TOKENS tokens (the format's
# `may_end_call`) before the whole turn is decoded, so a long turn's stop checks cost the same at
# token 16,000 as at token 16. Decoding a window differs from decoding the whole turn only at
# the window's start (a leading space a tokenizer strips, a character split between tokens), so
# the screen trusts a window whose text has at least TRUST_CHARS characters, else decodes it all.
TAIL_TOKENS, TRUST_CHARS = 32, 24


@dataclass(frozen=True)
class TurnLimits:
    """Per trajectory: model turns, and tokens of one tool result."""

    max_turns: int = 8
    max_tool_tokens: int = 256


class AgentHooks:
    """stop_fn / turn_end for the engine, over one run's tools."""

    def __init__(self, tok: Any, fmt: CallFormat, tools: ToolSet, runner: ToolRunner, limits: TurnLimits,
                 records: dict[str, dict], eos_ids: set[int], env_reward: bool = True):
        self.tok, self.fmt, self.tools, self.runner, self.limits = tok, fmt, tools, runner, limits
        self.records, self.eos_ids = records, set(eos_ids)
        self.env_reward = env_reward and tools.has_reward  # an explicit --reward wins
        self.candidates = fmt.stop_tokens(tok, self.eos_ids)

    def stop(self, seq: Any, emitted: list[int]) -> int | None:
        """How many emitted tokens the turn keeps if it ends in a tool call here, else None."""
        for i, t in enumerate(emitted):
            if t in self.candidates and self._ends_call(seq, emitted[: i + 1], t in self.eos_ids):
                return i + 1
        return None

    def _ends_call(self, seq: Any, emitted: list[int], at_eos: bool) -> bool:
        """Whether the turn so far, then `emitted`, ends in a call (screened on its tail first)."""
        if len(seq.tokens) - seq.turn_start + len(emitted) > TAIL_TOKENS:
            tail = self._text((seq.tokens[-TAIL_TOKENS:] + emitted)[-TAIL_TOKENS:])
            if len(tail.rstrip()) >= TRUST_CHARS and not self.fmt.may_end_call(tail, at_eos):
                return False
        return self.fmt.ends_call(self._text(seq.tokens[seq.turn_start:] + emitted), at_eos)

    def turn_end(self, seq: Any) -> Any:
        """The turn's tool output: tokens, a pending `ToolTurn`, a finish reason, or None (stop)."""
        if seq.runahead:
            return None
        calls = self.fmt.calls(self._text(seq.tokens[seq.turn_start:]), self._prefix(seq))
        if not calls:
            return None
        if len(seq.turns) >= self.limits.max_turns:
            return "max_turns"
        return self.runner.start(self.session(seq), calls, self._tokens, inline=self.tools.inline)

    def session(self, seq: Any) -> ToolSession:
        """The trajectory's tool session (made on first use, kept in the sequence)."""
        if "tool_session" not in seq.meta:
            seq.meta["tool_session"] = self.tools.session(self.records.get(seq.meta.get("prompt_id"), {}))
        return seq.meta["tool_session"]

    def finish(self, seq: Any) -> float | None:
        """A finished trajectory: its environment's reward (None without one), session closed."""
        if not self.env_reward and "tool_session" not in seq.meta:
            return None
        session = self.session(seq)
        try:
            return session.reward() if self.env_reward else None
        finally:
            session.close()
            del seq.meta["tool_session"]

    def close(self) -> None:
        self.runner.close()

    def _tokens(self, results: list[tuple[ToolCall, str]]) -> list[int]:
        cut = [(call, self._truncate(text)) for call, text in results]
        return list(self.tok.encode(self.fmt.render(cut), add_special_tokens=False))

    def _truncate(self, text: str) -> str:
        ids = self.tok.encode(text, add_special_tokens=False)
        if len(ids) <= self.limits.max_tool_tokens:
            return text
        return self.tok.decode(ids[: self.limits.max_tool_tokens], skip_special_tokens=True) + TRUNCATED

    def _prefix(self, seq: Any) -> str:
        """The conversation before the turn, for a tokenizer's response parser (which needs it)."""
        return self._text(seq.tokens[: seq.turn_start]) if self.fmt.needs_prefix else ""

    def _text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)
