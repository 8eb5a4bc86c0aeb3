"""The calculator tool: exact integer arithmetic, as a plain typed function.

It is the bundled workloads' tool, written in the interface any user tool uses (a function with
type hints and a docstring; `srtcli.rollout.agent.toolset` turns it into a JSON schema for the
chat template). It never calls eval(): a small recursive-descent parser over integers,
`+ - * /`, unary minus and parentheses. `/` must divide evenly; a bad expression, a division by
zero or an uneven division gives the value `error`, never an exception, because a sampled model
writes garbage sometimes and that must cost reward, not the run.
"""

from __future__ import annotations

import re

ERROR = "error"

# Bounds that keep one call cheap whatever the model writes: numbers stay below ~10**MAX_EXPR_CHARS.
MAX_EXPR_CHARS = 200
MAX_DEPTH = 32


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


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression exactly.

    Args:
        expression: integers with + - * / and parentheses, for example (12-4)*3
    """
    value = evaluate(expression)
    return ERROR if value is None else str(value)
