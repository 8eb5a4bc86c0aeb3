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
            if t in self.candidates:
                text = self._text(seq.tokens[seq.turn_start:] + emitted[: i + 1])
                if self.fmt.ends_call(text, t in self.eos_ids):
                    return i + 1
        return None

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
