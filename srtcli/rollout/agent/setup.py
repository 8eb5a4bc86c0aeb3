"""The tool side of one rollout, decided once from `--tools` and the model's tokenizer.

A tokenizer whose chat template shows tools to the model gets `ChatFormat` (the schemas go into
every prompt, calls and results in the template's own format); any other tokenizer gets the
bundled model's `TagFormat`, which only knows a tool named `calculator`. Everything the user can
get wrong (an unknown module, a tool without a docstring, a tag-format model with other tools)
fails here, before the pool is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srtcli.errors import SrtError
from srtcli.rollout.agent.formats import CallFormat, ChatFormat, TagFormat, chat_format_for
from srtcli.rollout.agent.hooks import AgentHooks, TurnLimits
from srtcli.rollout.agent.runner import ToolRunner
from srtcli.rollout.agent.toolset import ToolSet, load_tools
from srtcli.rollout.config import RolloutConfig

TAG_ROOM = 64  # context beyond --max-new-tokens for the tag format's short results
TURN_OVERHEAD = 32  # template tokens around one tool result (tool turn, next assistant turn)


@dataclass(frozen=True)
class ToolOptions:
    """What the tool side reads of a run's options (`srt rollout`'s flags of these names; its
    defaults)."""

    max_turns: int = RolloutConfig.max_turns
    max_tool_tokens: int = RolloutConfig.max_tool_tokens
    tool_timeout: float = RolloutConfig.tool_timeout
    tool_workers: int = RolloutConfig.tool_workers
    reward_spec: str | None = None  # an explicit reward: an environment's `get_reward` is then unused

    @classmethod
    def of(cls, config: RolloutConfig) -> ToolOptions:
        """A `RolloutConfig`'s."""
        return cls(config.max_turns, config.max_tool_tokens, config.tool_timeout, config.tool_workers,
                   config.reward_spec)


@dataclass
class AgentSetup:
    """The run's tools and call format; `hooks` builds the engine's stop and turn-end hooks."""

    tools: ToolSet
    fmt: CallFormat

    @property
    def schemas(self) -> list[dict] | None:
        """What the prompts show the model (the tag format shows nothing)."""
        return self.tools.schemas if isinstance(self.fmt, ChatFormat) else None

    def room(self, opts: ToolOptions) -> int:
        """Context a trajectory may need beyond its prompt and --max-new-tokens."""
        if isinstance(self.fmt, TagFormat):
            return TAG_ROOM
        return opts.max_turns * (opts.max_tool_tokens + TURN_OVERHEAD)

    def hooks(self, tok: Any, opts: ToolOptions, records: dict[str, dict], eos_ids: set[int]) -> AgentHooks:
        runner = ToolRunner(opts.tool_workers, opts.tool_timeout)
        limits = TurnLimits(opts.max_turns, opts.max_tool_tokens)
        return AgentHooks(tok, self.fmt, self.tools, runner, limits, records, eos_ids,
                          env_reward=opts.reward_spec is None)


def agent_for(spec: str, tok: Any) -> AgentSetup | None:
    """The tool side of a run with `--tools spec` (None for `none`)."""
    if spec == "none":
        return None
    tools = load_tools(spec)
    if chat_format_for(tok):
        try:
            return AgentSetup(tools, ChatFormat(tok))
        except Exception as e:
            raise SrtError(f"--tools {spec}: the model's chat template cannot render a tool turn: "
                           f"{' '.join(str(e).split())}") from None
    if "calculator" not in tools.names:
        raise SrtError(f"--tools {spec}: the model's chat template does not show tools to the model; without "
                       "one srt knows only the <calc>EXPR</calc> tag format, which calls a tool named calculator")
    return AgentSetup(tools, TagFormat())
