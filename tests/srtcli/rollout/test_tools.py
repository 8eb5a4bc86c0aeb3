"""The calculator tool: exact integer arithmetic, safe parsing, and finding the call that ends a turn."""

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtcli.errors import SrtError
from srtcli.rollout.tools import STOP_STRINGS, TOOLS, ToolCall, calculator, evaluate, find_tool_call, run_tool


@pytest.mark.parametrize(
    "expr, value",
    [
        ("3+4", "7"),
        (" 12 * 3 ", "36"),
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("20-4-3", "13"),  # left associative
        ("48/4/2", "6"),  # left associative: (48/4)/2, not 48/(4/2)=24
        ("-5+2", "-3"),
        ("-(3-10)", "7"),
        ("7*-2", "-14"),
        ("-12/4", "-3"),
        ("0*99", "0"),
        ("123456789*987654321", str(123456789 * 987654321)),
    ],
)
def test_calculator_values(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize(
    "expr",
    ["7/2", "-7/2", "5/0", "0/0", "", "3+", "(3+4", "3+4)", "3 4", "2**3", "3.5+1", "x", "__import__('os')",
     "1e3", "3//2", "(" * 40 + "1" + ")" * 40, "-" * 40 + "1", "9" * 300],
)
def test_bad_expressions_give_error_never_raise(expr):
    assert calculator(expr) == "error"
    assert run_tool("calculator", expr) == "<result>error</result>"


def _random_expr(rng, depth=0):
    if depth > 3 or rng.random() < 0.3:
        return str(rng.randint(0, 50))
    op = rng.choice("+-*/")
    a, b = _random_expr(rng, depth + 1), _random_expr(rng, depth + 1)
    return f"({a}){op}({b})" if rng.random() < 0.5 else f"{a}{op}{b}"


def _reference(expr):
    """An independent evaluator over Fractions (Python's own precedence), used only in tests."""
    tokens = expr.replace("/", " / ").replace("(", " ( ").replace(")", " ) ")
    for ch in "+-*":
        tokens = tokens.replace(ch, f" {ch} ")
    src = " ".join(f"Fraction({t})" if t.isdigit() else t for t in tokens.split())
    try:
        value = eval(src, {"Fraction": Fraction})  # test oracle only; the tool itself never evals
    except ZeroDivisionError:
        return None
    return value


def _disagreements(evaluator, n=2000):
    """(checked, mismatches) of `evaluator` against the oracle on n seeded random expressions."""
    rng = random.Random(0)
    checked = mismatches = 0
    for _ in range(n):
        expr = _random_expr(rng)
        got, ref = evaluator(expr), _reference(expr)
        # The tool demands every division be exact, the oracle only sees the final value: compare
        # where the tool found a value, and require one wherever no division is involved.
        if got is not None:
            checked += 1
            mismatches += ref is None or ref != got
        elif ref is not None and "/" not in expr:
            mismatches += 1
    return checked, mismatches


def test_random_expressions_agree_with_an_independent_evaluator():
    checked, mismatches = _disagreements(evaluate)
    assert mismatches == 0 and checked > 800


def _floor_dividing(expr):
    """A deliberately wrong calculator: Python's floor division instead of exact division."""
    try:
        return int(eval(expr.replace("/", "//")))
    except (ZeroDivisionError, SyntaxError):
        return None


def _right_associative(expr):
    """A deliberately wrong calculator: a-b-c read as a-(b-c)."""
    value = evaluate(expr.replace("-", "-("))
    return value if "-" not in expr else evaluate(expr.replace("-", "-(") + ")" * expr.count("-"))


@pytest.mark.parametrize("wrong", [_floor_dividing, _right_associative])
def test_the_oracle_catches_a_wrong_calculator(wrong):
    assert _disagreements(wrong)[1] > 0


@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
@settings(max_examples=200, deadline=None)
def test_exact_division_property(a, b):
    expr = f"({a})/({b})"
    if b != 0 and a % b == 0:
        assert evaluate(expr) == a // b
    else:
        assert evaluate(expr) is None


def test_find_tool_call_takes_the_call_that_ends_the_text():
    text = "Tom has 3 apples.<calc>3*4</calc>"
    call = find_tool_call(text)
    assert call == ToolCall("calculator", {"expression": "3*4"})
    assert run_tool("calculator", call) == "<result>12</result>"
    assert find_tool_call(text + " \n") == call  # trailing whitespace is fine
    # an earlier answered call is ignored; the new one is found
    two = text + "<result>12</result> then <calc>12+1</calc>"
    assert find_tool_call(two).arguments == {"expression": "12+1"}
    assert run_tool("calculator", find_tool_call(two)) == "<result>13</result>"


@pytest.mark.parametrize(
    "text",
    [
        "no call here",
        "<calc>3*4</calc><result>12</result>",  # already answered
        "<calc>3*4",  # not closed yet
        "3*4</calc>",  # no opening tag
        "<calc>1</calc><result>1</result> 2+2</calc>",  # opening tag belongs to the old call
        "<calc>3*4</calc> and more",  # closing tag does not end the text
    ],
)
def test_find_tool_call_none(text):
    assert find_tool_call(text) is None


def test_registry_and_unknown_tool():
    assert set(TOOLS) == {"calculator"} and STOP_STRINGS == ("</calc>",)
    with pytest.raises(SrtError, match="unknown tool 'python'"):
        run_tool("python", "1+1")
