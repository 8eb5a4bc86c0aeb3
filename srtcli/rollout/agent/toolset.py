"""The user's tools, as `--tools` names them: their JSON schemas for the chat template, and one
`ToolSession` per trajectory that runs a parsed call and never raises.

`--tools` takes a built-in name (`calculator`, `python`) or `MODULE:NAME` / `FILE.py:NAME`
(several: comma-separated) naming one of
- a function with type hints and a docstring (`Args:` section), the convention of transformers'
  chat templates (`tools=`) and TRL's `GRPOTrainer(tools=...)`;
- a list or tuple of such functions;
- a class: an environment (TRL's `environment_factory` shape), one instance per trajectory,
  `reset(**prompt_fields)` before its first use, its public methods (other than `reset`,
  `get_reward`, `close`) as the tools, and an optional `get_reward()` giving the trajectory's
  reward when the run has no `--reward`.

Schemas come from `transformers.utils.get_json_schema`, so a tool the chat template can show is
a tool srt can run. A call's failure (a malformed call, an unknown tool, wrong arguments, an
exception in the tool) is an `error: ...` result the model reads, never a crashed run.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

from srtcli.errors import SrtError
from srtcli.user_code import load_target, one_line

NOT_TOOLS = {"reset", "get_reward", "close"}


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a model turn; `error` says why it cannot run (a malformed call)."""

    name: str
    arguments: dict | None
    error: str | None = None


BUILTIN = ("calculator", "python")


def builtin_tool(name: str) -> Callable:
    """A built-in tool by name (imported only when asked for)."""
    if name == "calculator":
        from srtcli.rollout.agent.calculator import calculator

        return calculator
    from srtcli.rollout.agent.sandbox import python

    return python


@dataclass
class ToolSet:
    """The tools of a run. `env_class` is set for an environment, else `functions` are the tools."""

    spec: str
    schemas: list[dict]
    functions: dict[str, Callable]
    env_class: type | None = None
    inline: bool = False  # every tool is cheap and pure: run in the engine's thread (reproducible)

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]

    @property
    def has_reward(self) -> bool:
        return self.env_class is not None and callable(getattr(self.env_class, "get_reward", None))

    def session(self, record: dict) -> "ToolSession":
        """The tools of one trajectory (a fresh environment instance, reset on `record`)."""
        if self.env_class is None:
            return ToolSession(self.functions, None)
        env = _make_env(self.spec, self.env_class)
        reset = getattr(env, "reset", None)
        if callable(reset):
            try:
                reset(**_accepted(reset, record))
            except Exception as e:  # the user's environment is broken: stop, do not feed the model
                raise SrtError(f"tools {self.spec}: reset() raised {type(e).__name__}: {one_line(e)} "
                               f"(prompt {record.get('id', '?')!r})") from None
        return ToolSession(_env_tools(env), env)


class ToolSession:
    """Runs one trajectory's calls, one at a time; every outcome is result text."""

    def __init__(self, functions: dict[str, Callable], env: Any):
        self.functions, self.env = functions, env

    def call(self, call: ToolCall) -> str:
        if call.error is not None:
            return f"error: {call.error}"
        fn = self.functions.get(call.name)
        if fn is None:
            return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(self.functions))}"
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as e:
            return f"error: bad arguments for {call.name}: {one_line(e)}"
        try:
            return _as_text(fn(**call.arguments))
        except SrtError:  # the tool's machinery, not the call, is broken (a sandbox that cannot start)
            raise
        except Exception as e:  # the user's tool failed: the model sees it, the run goes on
            return f"error: {type(e).__name__}: {one_line(e)}"

    def reward(self) -> float | None:
        """The environment's reward for the trajectory (None without `get_reward`); a failing or
        non-numeric reward stops the run in one line, as a failing `--reward` does."""
        fn = getattr(self.env, "get_reward", None)
        if fn is None:
            return None
        try:
            value = fn()
        except Exception as e:
            raise SrtError(f"get_reward() raised {type(e).__name__}: {one_line(e)}") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise SrtError(f"get_reward() returned {value!r}, not a finite number")
        return float(value)

    def close(self) -> None:
        fn = getattr(self.env, "close", None)
        if callable(fn):
            fn()


def load_tools(spec: str) -> ToolSet:
    """The ToolSet `--tools SPEC` names (several, comma-separated); a one-line SrtError for
    anything unusable."""
    if "," in spec:
        return _joined(spec, [load_tools(part.strip()) for part in spec.split(",")])
    if spec in BUILTIN:
        return _function_set(spec, [builtin_tool(spec)], inline=spec == "calculator")
    obj = load_target(spec, "--tools", [*BUILTIN, "none"], "tools")
    if inspect.isclass(obj):
        probe = _make_env(spec, obj)
        return ToolSet(spec, _schemas(spec, list(_env_tools(probe).values())), {}, env_class=obj)
    if callable(obj):
        return _function_set(spec, [obj])
    if isinstance(obj, (list, tuple)) and obj and all(callable(f) for f in obj):
        return _function_set(spec, list(obj))
    raise SrtError(f"tools {spec}: expected a function, a list of functions or an environment class, "
                   f"got {type(obj).__name__}")


def _joined(spec: str, sets: list[ToolSet]) -> ToolSet:
    if any(s.env_class is not None for s in sets):
        raise SrtError(f"--tools {spec}: an environment class cannot be combined with other tools")
    fns = [f for s in sets for f in s.functions.values()]
    return _function_set(spec, fns, inline=all(s.inline for s in sets))


def _function_set(spec: str, fns: list[Callable], inline: bool = False) -> ToolSet:
    schemas = _schemas(spec, fns)
    return ToolSet(spec, schemas, {s["function"]["name"]: f for s, f in zip(schemas, fns)}, inline=inline)


def _schemas(spec: str, fns: list[Callable]) -> list[dict]:
    from transformers.utils import get_json_schema

    out = []
    for fn in fns:
        try:
            out.append(get_json_schema(fn))
        except Exception as e:
            name = getattr(fn, "__name__", repr(fn))
            raise SrtError(f"tools {spec}: {name} cannot be described to the model: {one_line(e)} "
                           "(a tool needs type hints and a docstring with an Args: section)") from None
    names = [s["function"]["name"] for s in out]
    if len(set(names)) != len(names):
        raise SrtError(f"tools {spec}: two tools share a name ({', '.join(names)})")
    return out


def _make_env(spec: str, env_class: type) -> Any:
    try:
        return env_class()
    except Exception as e:
        raise SrtError(f"tools {spec}: creating the environment raised {type(e).__name__}: {one_line(e)}") from None


def _env_tools(env: Any) -> dict[str, Callable]:
    return {name: getattr(env, name) for name in dir(type(env))
            if not name.startswith("_") and name not in NOT_TOOLS and callable(getattr(env, name))}


def _accepted(fn: Callable, record: dict) -> dict:
    """The prompt record's fields that `fn` takes (all of them if it takes **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(record)
    names = {p.name for p in params}
    return {k: v for k, v in record.items() if k in names}


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
