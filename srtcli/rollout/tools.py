"""Tools a model may call during rollout; today one: the calculator of the bundled workload.

The syntax is fixed in docs/formats.md. The model emits `<calc>EXPR</calc>`; the rollout engine
stops the turn at `</calc>`, asks `find_tool_call(text)` for the call that closing tag ends, runs
it with `run_tool(name, call)` and appends the returned `<result>VALUE</result>` as non-trained
tokens before the next turn.

    call = find_tool_call(text)            # ToolCall | None
    if call is not None:
        text += run_tool(call.name, call)  # "<result>12</result>" or "<result>error</result>"

The calculator never calls eval(): a small recursive-descent parser over integers, `+ - * /`,
unary minus and parentheses, with exact arithmetic. `/` must divide evenly; a bad expression,
a division by zero or an uneven division gives the value `error`, never an exception, because
a sampled model writes garbage sometimes and that must cost reward, not the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from srtcli.errors import SrtError

CALC_OPEN, CALC_CLOSE = "<calc>", "</calc>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ERROR = "error"

# Bounds that keep one call cheap whatever the model writes: numbers stay below ~10**MAX_LEN.
MAX_EXPR_CHARS = 200
MAX_DEPTH = 32


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call found in generated text.

    `end` is the index in the text just past the closing tag (the engine's turn ends there).
    """

    name: str
    expr: str
    end: int


@dataclass(frozen=True)
class Tool:
    """A tool: its tags and a function from the expression text to the result value."""

    name: str
    open_tag: str
    close_tag: str
    run: Callable[[str], str]


class _Bad(Exception):
    """Internal: the expression cannot be evaluated; becomes the value `error`."""


_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


def _tokenize(expr: str) -> list[str]:
    tokens, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise _Bad(f"unexpected character at {pos}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*;
    unary := '-' unary | '+' unary | atom; atom := INT | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Bad("unexpected end")
        self.i += 1
        return tok

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> int:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.unary()
            if op == "*":
                value *= rhs
            elif rhs == 0 or value % rhs != 0:
                raise _Bad("division by zero or uneven division")
            else:
                value //= rhs  # exact here, so floor and truncation agree
        return value

    def unary(self) -> int:
        if self.peek() in ("-", "+"):
            self.depth += 1  # chains of signs count as nesting too
            if self.depth > MAX_DEPTH:
                raise _Bad("nested too deep")
            sign = -1 if self.take() == "-" else 1
            value = sign * self.unary()
            self.depth -= 1
            return value
        return self.atom()

    def atom(self) -> int:
        tok = self.take()
        if tok.isdigit():
            return int(tok)
        if tok != "(":
            raise _Bad(f"unexpected {tok!r}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Bad("nested too deep")
        value = self.expr()
        if self.take() != ")":
            raise _Bad("missing ')'")
        self.depth -= 1
        return value


def evaluate(expr: str) -> int | None:
    """The exact integer value of a calculator expression, or None if it has none."""
    if len(expr) > MAX_EXPR_CHARS:
        return None
    try:
        parser = _Parser(_tokenize(expr))
        value = parser.expr()
        if parser.peek() is not None:
            return None
        return value
    except _Bad:
        return None


def calculator(expr: str) -> str:
    """The calculator's result value as text: the integer, or `error`."""
    value = evaluate(expr)
    return ERROR if value is None else str(value)


TOOLS: dict[str, Tool] = {"calculator": Tool("calculator", CALC_OPEN, CALC_CLOSE, calculator)}

# Strings at which a rollout engine must stop a turn to run a tool.
STOP_STRINGS: tuple[str, ...] = tuple(t.close_tag for t in TOOLS.values())


def find_tool_call(text: str) -> ToolCall | None:
    """The tool call whose closing tag ends `text` (trailing whitespace allowed), or None.

    Only a call at the very end counts: calls earlier in the text were answered already. The
    expression is what lies between that closing tag and the nearest opening tag before it;
    a closing tag without an opening tag since the previous result is not a call.
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
        return ToolCall(tool.name, expr, close_at + len(tool.close_tag))
    return None


def run_tool(name: str, call: ToolCall | str) -> str:
    """Run tool `name` on a call (or a bare expression); returns `<result>VALUE</result>`.

    Never raises on a bad expression (the value is `error`); an unknown tool name is a
    programming or configuration error and raises SrtError.
    """
    tool = TOOLS.get(name)
    if tool is None:
        raise SrtError(f"unknown tool {name!r}; known: {', '.join(sorted(TOOLS))}")
    expr = call.expr if isinstance(call, ToolCall) else call
    return f"{RESULT_OPEN}{tool.run(expr)}{RESULT_CLOSE}"


def tool_hooks(tok: Any, tool: str) -> tuple[Callable, Callable]:
    """(stop_fn, turn_end) for the embedded engine: stop a turn where a tool call closes, then
    append the tool's result as non-trained tokens."""
    ends = {i for t, i in tok.get_vocab().items() if ">" in tok.convert_tokens_to_string([t])}

    def stop_fn(seq: Any, emitted: list[int]) -> int | None:
        for i, t in enumerate(emitted):
            if t in ends:
                text = tok.decode(seq.tokens[seq.turn_start:] + emitted[: i + 1], skip_special_tokens=False)
                if find_tool_call(text) is not None:
                    return i + 1
        return None

    def turn_end(seq: Any) -> list[int] | None:
        call = find_tool_call(tok.decode(seq.tokens[seq.turn_start:], skip_special_tokens=False))
        if call is None:
            return None
        return list(tok.encode(run_tool(tool, call), add_special_tokens=False))

    return stop_fn, turn_end
