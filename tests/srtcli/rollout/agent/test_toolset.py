"""`--tools`: the user's functions, lists of functions or environment classes, described to the
model by their schemas, each call's failure an error result, never an exception."""

from __future__ import annotations

import textwrap

import pytest

from srtcli.errors import SrtError
from srtcli.rollout.agent.toolset import ToolCall, load_tools

TOOLS_PY = '''
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def fail(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("broken\\non two lines")


def undocumented(x: str) -> str:
    return x


class Counter:
    """An environment: state across one trajectory's calls, and a reward."""

    def reset(self, answer: str = "", **kwargs) -> None:
        self.answer, self.calls = answer, 0

    def bump(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: how much
        """
        self.calls += by
        return str(self.calls)

    def get_reward(self) -> float:
        return float(str(self.calls) == self.answer)


BOTH = [add, fail]
NOT_A_TOOL = 3
'''


@pytest.fixture()
def tools_py(tmp_path):
    path = tmp_path / "mytools.py"
    path.write_text(textwrap.dedent(TOOLS_PY))
    return path


def test_builtin_calculator_is_described_by_its_docstring():
    tools = load_tools("calculator")
    (schema,) = tools.schemas
    assert schema["function"]["name"] == "calculator" and "expression" in schema["function"]["parameters"]["properties"]
    assert tools.inline  # pure and microseconds: runs in the engine's thread, so runs are reproducible
    assert tools.session({}).call(ToolCall("calculator", {"expression": "6*7"})) == "42"


def test_a_list_of_functions_from_a_file(tools_py):
    tools = load_tools(f"{tools_py}:BOTH")
    assert tools.names == ["add", "fail"] and not tools.inline
    s = tools.session({})
    assert s.call(ToolCall("add", {"a": 2, "b": 3})) == "5"  # non-string results become JSON text


@pytest.mark.parametrize("call, text", [
    (ToolCall("add", {"a": 1}), "error: bad arguments for add: missing a required argument: 'b'"),
    (ToolCall("add", {"a": 1, "b": 2, "c": 3}), "error: bad arguments for add: got an unexpected keyword argument 'c'"),
    (ToolCall("nope", {}), "error: unknown tool 'nope'; tools: add, fail"),
    (ToolCall("fail", {"x": "y"}), "error: RuntimeError: broken on two lines"),
    (ToolCall("", None, "the tool call is not valid JSON"), "error: the tool call is not valid JSON"),
])
def test_every_failed_call_is_a_result_the_model_reads(tools_py, call, text):
    assert load_tools(f"{tools_py}:BOTH").session({}).call(call) == text


def test_an_environment_class_is_one_instance_per_trajectory_reset_on_its_prompt(tools_py):
    tools = load_tools(f"{tools_py}:Counter")
    assert tools.names == ["bump"] and tools.has_reward
    a, b = tools.session({"answer": "3", "prompt": "p"}), tools.session({"answer": "1"})
    a.call(ToolCall("bump", {"by": 1}))
    assert a.call(ToolCall("bump", {"by": 2})) == "3" and b.call(ToolCall("bump", {"by": 1})) == "1"
    assert a.reward() == 1.0 and b.reward() == 1.0


@pytest.mark.parametrize("name, message", [
    ("undocumented", "undocumented cannot be described to the model"),
    ("NOT_A_TOOL", "expected a function, a list of functions or an environment class, got int"),
    ("missing", "has no attribute 'missing'"),
])
def test_unusable_tools_are_one_line_errors(tools_py, name, message):
    with pytest.raises(SrtError, match=message) as e:
        load_tools(f"{tools_py}:{name}")
    assert "\n" not in str(e.value)


def test_a_missing_module_or_a_bad_spec_is_one_line(tmp_path):
    with pytest.raises(SrtError, match="tools module 'no_such_module_x' not found"):
        load_tools("no_such_module_x:f")
    with pytest.raises(SrtError, match=r"expected a built-in \(calculator, none, python\) or MODULE:NAME"):
        load_tools("calc")
    with pytest.raises(SrtError, match="tools file not found"):
        load_tools(f"{tmp_path / 'none.py'}:f")


def test_a_broken_tool_machinery_stops_the_run_instead_of_feeding_errors():
    from srtcli.rollout.agent.toolset import ToolSession

    def sandboxed(code: str) -> str:
        raise SrtError("sandbox: cannot start /no/python")

    with pytest.raises(SrtError, match="cannot start"):
        ToolSession({"sandboxed": sandboxed}, None).call(ToolCall("sandboxed", {"code": "1"}))


def test_several_tools_comma_separated(tools_py):
    tools = load_tools(f"calculator,python,{tools_py}:add")
    assert tools.names == ["calculator", "python", "add"] and not tools.inline
    with pytest.raises(SrtError, match="cannot be combined"):
        load_tools(f"calculator,{tools_py}:Counter")
    with pytest.raises(SrtError, match="two tools share a name"):
        load_tools("calculator,calculator")


def test_an_environment_that_cannot_start_is_one_line(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text("class Broken:\n    def __init__(self):\n        raise OSError('no database')\n\n"
                    "class BadReset:\n    def reset(self, **kw):\n        raise KeyError('answer')\n\n"
                    "    def look(self, x: str) -> str:\n        '''Look.\n\n        Args:\n            x: what\n        '''\n"
                    "        return x\n")
    with pytest.raises(SrtError, match="creating the environment raised OSError: no database"):
        load_tools(f"{path}:Broken")
    tools = load_tools(f"{path}:BadReset")
    with pytest.raises(SrtError, match=r"reset\(\) raised KeyError: 'answer' \(prompt 'p1'\)"):
        tools.session({"id": "p1"})


@pytest.mark.parametrize("body, message", [("raise ValueError('x')", "get_reward\\(\\) raised ValueError: x"),
                                           ("return float('nan')", "not a finite number"),
                                           ("return 'high'", "not a finite number")])
def test_a_failing_environment_reward_is_one_line(tmp_path, body, message):
    path = tmp_path / "envr.py"
    path.write_text(f"class E:\n    def get_reward(self):\n        {body}\n")
    with pytest.raises(SrtError, match=message):
        load_tools(f"{path}:E").session({}).reward()
