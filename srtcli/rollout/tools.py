"""The bundled model's tag-format tool calls: `<calc>EXPR</calc>` answered by `<result>VALUE</result>`.

Models whose chat template declares tools use `srtcli.rollout.agent` instead (chat-template
tool calls, any user tool). The syntax here is fixed in docs/formats.md. The model emits
`<calc>EXPR</calc>`; the rollout engine stops the turn at `</calc>`, asks `find_tool_call(text)`
for the call that closing tag ends, runs it with `run_tool(name, call)` and appends the returned
`<result>VALUE</result>` as non-trained tokens before the next turn.

    call = find_tool_call(text)            # ToolCall(name, {"expression": EXPR}) | None
    if call is not None:
        text += run_tool(call.name, call)  # "<result>12</result>" or "<result>error</result>"

The calculator itself is `srtcli.rollout.agent.calculator` (exact integer arithmetic, never eval).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from srtcli.errors import SrtError
from srtcli.rollout.agent.toolset import ToolCall
# re-exported: the tag format's calculator is the one tool implementation
from srtcli.rollout.agent.calculator import ERROR, calculator, evaluate  # noqa: F401

CALC_OPEN, CALC_CLOSE = "<calc>", "</calc>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"


@dataclass(frozen=True)
class Tool:
    """A tool: its tags and a function from the expression text to the result value."""

    name: str
    open_tag: str
    close_tag: str
    run: Callable[[str], str]


TOOLS: dict[str, Tool] = {"calculator": Tool("calculator", CALC_OPEN, CALC_CLOSE, calculator)}

# Strings at which a rollout engine must stop a turn to run a tool.
STOP_STRINGS: tuple[str, ...] = tuple(t.close_tag for t in TOOLS.values())


def find_tool_call(text: str) -> ToolCall | None:
    """The tool call whose closing tag ends `text` (trailing whitespace allowed), or None.

    Only a call at the very end counts: calls earlier in the text were answered already. The
    expression (the call's one argument, `expression`) is what lies between that closing tag
    and the nearest opening tag before it; a closing tag without an opening tag since the
    previous result is not a call.
    """
    stripped = text.rstrip()
    for tool in TOOLS.values():
        if not stripped.endswith(tool.close_tag):
            continue
        close_at = len(stripped) - len(tool.close_tag)
        open_at = stripped.rfind(tool.open_tag, 0, close_at)
        if open_at < 0:
            return None
        expr = stripped[open_at + len(tool.open_tag) : close_at]
        if tool.close_tag in expr or RESULT_CLOSE in expr:
            return None  # the opening tag belongs to an earlier, already closed call
        return ToolCall(tool.name, {"expression": expr})
    return None


def run_tool(name: str, call: ToolCall | str) -> str:
    """Run tool `name` on a call (or a bare expression); returns `<result>VALUE</result>`.

    Never raises on a bad expression (the value is `error`); an unknown tool name is a
    programming or configuration error and raises SrtError.
    """
    tool = TOOLS.get(name)
    if tool is None:
        raise SrtError(f"unknown tool {name!r}; known: {', '.join(sorted(TOOLS))}")
    expr = call.arguments["expression"] if isinstance(call, ToolCall) else call
    return result_tag(tool.run(expr))


def result_tag(value: str) -> str:
    """A tool's result as the tag format writes it: `<result>VALUE</result>`."""
    return f"{RESULT_OPEN}{value}{RESULT_CLOSE}"
