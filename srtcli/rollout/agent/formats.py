"""How tool calls look in a model's output and how results go back: one `CallFormat` per style.

- `ChatFormat`: the chat template's own format. The model's turn ends at its eos; the calls in
  it are `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes style, as Qwen2.5
  and many others write them), or whatever the tokenizer's `response_template` parses
  (transformers' `parse_response`) when it defines one and transformers parses with the prompt
  as `prefix` (5.19 does; 5.10 reads another schema format, `response_schema`), so before it a
  `response_template` is left unused and calls are read as Hermes `<tool_call>` JSON. Results are rendered by the chat
  template as `tool` messages: the text the template puts between the end of the model's turn
  and the next assistant turn, computed by rendering the conversation with and without them.
- `TagFormat`: the bundled model's `<calc>EXPR</calc>` ... `<result>VALUE</result>` (one tool,
  the calculator; srtcli.rollout.tools), which ends a turn at `</calc>` rather than at eos.

`chat_format_for(tok)` says whether a tokenizer's template renders tools at all.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any, Protocol

from srtcli.errors import SrtError
from srtcli.rollout.agent.toolset import ToolCall
from srtcli.rollout.tools import STOP_STRINGS, find_tool_call, result_tag

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TURN = "\x00srt-turn\x00"  # stands for the model's turn when rendering around it


class CallFormat(Protocol):
    needs_prefix: bool  # whether `calls` reads the conversation before the turn

    def stop_tokens(self, tok: Any, eos_ids: set[int]) -> set[int]:
        """The tokens at which a call can be complete (where the engine asks `ends_call`)."""

    def ends_call(self, turn_text: str, at_eos: bool) -> bool:
        """Whether the turn so far (ending at an eos, or at a stop-candidate token) calls a tool."""

    def may_end_call(self, tail_text: str, at_eos: bool) -> bool:
        """A necessary condition for `ends_call`, read from the end of the turn's text alone (its
        last tokens decoded): False means the turn does not end in a call here."""

    def calls(self, turn_text: str, prefix: str = "") -> list[ToolCall]:
        """The calls in a finished turn (after `prefix`, the conversation so far), in order;
        malformed ones carry their error."""

    def render(self, results: list[tuple[ToolCall, str]]) -> str:
        """The text appended after the turn: the results, and the opening of the next turn."""


class TagFormat:
    """`<calc>EXPR</calc>` answered by `<result>VALUE</result>` (the calculator only)."""

    needs_prefix = False

    def stop_tokens(self, tok: Any, eos_ids: set[int]) -> set[int]:
        # a tag closes with '>': only tokens that contain one can end a call
        return {i for t, i in tok.get_vocab().items() if ">" in tok.convert_tokens_to_string([t])}

    def ends_call(self, turn_text: str, at_eos: bool) -> bool:
        return not at_eos and find_tool_call(turn_text) is not None

    def may_end_call(self, tail_text: str, at_eos: bool) -> bool:
        return not at_eos and tail_text.rstrip().endswith(STOP_STRINGS)  # `find_tool_call` needs a closing tag

    def calls(self, turn_text: str, prefix: str = "") -> list[ToolCall]:
        call = find_tool_call(turn_text)
        return [] if call is None else [call]

    def render(self, results: list[tuple[ToolCall, str]]) -> str:
        return "".join(result_tag(text) for _, text in results)


class ChatFormat:
    """Calls in the chat template's format, results as `tool` messages rendered by the template."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.template = getattr(tok, "response_template", None) if parses_with_prefix(tok) else None
        base = self._chat([_user(), {"role": "assistant", "content": _TURN}], False)
        after_turn = base[base.index(_TURN) + len(_TURN):]
        eos = tok.eos_token or ""
        # the model emitted the eos that closes its turn; what the template adds after it is ours
        self.glue = after_turn[len(eos):] if eos and after_turn.startswith(eos) else after_turn
        self.base = base
        self.needs_prefix = bool(self.template)  # a response parser reads the conversation too

    def stop_tokens(self, tok: Any, eos_ids: set[int]) -> set[int]:
        return set(eos_ids)  # the turn ends at eos

    def _chat(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def ends_call(self, turn_text: str, at_eos: bool) -> bool:
        return at_eos and OPEN in turn_text

    def may_end_call(self, tail_text: str, at_eos: bool) -> bool:
        return at_eos

    def calls(self, turn_text: str, prefix: str = "") -> list[ToolCall]:
        if self.template:
            return self._parsed_calls(turn_text, prefix)
        out = [_hermes_call(body) for body in CALL.findall(turn_text)]
        tail = turn_text[turn_text.rfind(CLOSE) + len(CLOSE):] if out else turn_text
        if OPEN in tail:
            out.append(ToolCall("", None, "a <tool_call> without its closing </tool_call>"))
        return out

    def _parsed_calls(self, turn_text: str, prefix: str) -> list[ToolCall]:
        try:
            message = self.tok.parse_response(turn_text, prefix=prefix)
        except Exception as e:
            return [ToolCall("", None, f"the tool call could not be parsed: {' '.join(str(e).split())}")]
        calls = message.get("tool_calls") or []
        return [_structured_call(c.get("function", c)) for c in calls]

    def render(self, results: list[tuple[ToolCall, str]]) -> str:
        tools = [{"role": "tool", "name": c.name, "content": text} for c, text in results]
        full = self._chat([_user(), {"role": "assistant", "content": _TURN}, *tools], True)
        if not full.startswith(self.base):
            raise SrtError("the chat template renders an assistant turn differently when tool messages follow; "
                           "srt cannot append tool results to a turn in progress with it")
        return self.glue + full[len(self.base):]


def parses_with_prefix(tok: Any) -> bool:
    """Whether this transformers' `parse_response` (of a tokenizer or its class) reads a
    `response_template` with the prompt as `prefix` (the format srt and TRL parse with); earlier
    releases take neither."""
    parse = getattr(tok, "parse_response", None)
    return parse is not None and "prefix" in inspect.signature(parse).parameters


def chat_format_for(tok: Any) -> bool:
    """Whether the tokenizer's chat template shows tools to the model (renders `tools=`)."""
    if not getattr(tok, "chat_template", None):
        return False
    schema = {"type": "function", "function": {"name": "srt_probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
    try:
        with_tools = tok.apply_chat_template([_user()], tools=[schema], tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that cannot take tools at all
        return False
    return "srt_probe_tool" in with_tools


def _user() -> dict:
    return {"role": "user", "content": "u"}


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", None, f"the tool call is not valid JSON ({e.msg} at character {e.pos})")
    if not isinstance(obj, dict):
        return ToolCall("", None, "the tool call must be a JSON object with name and arguments")
    return _structured_call(obj)


def _structured_call(obj: dict) -> ToolCall:
    name, args = obj.get("name"), obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(str(name or ""), None, "the arguments are not valid JSON")
    if not isinstance(name, str) or not name:
        return ToolCall("", None, "the tool call has no name")
    if not isinstance(args, dict):
        return ToolCall(name, None, "the arguments must be a JSON object")
    return ToolCall(name, args)
