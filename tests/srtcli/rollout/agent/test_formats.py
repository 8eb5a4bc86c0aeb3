"""Tool calls in the chat template's format: parsing the model's turn, and results rendered so that
prompt + turns + results is exactly what the chat template renders for the whole conversation."""

from __future__ import annotations

import json

import pytest

from srtcli.rollout.agent.calculator import calculator
from srtcli.rollout.agent.formats import ChatFormat, TagFormat, chat_format_for, parses_with_prefix
from srtcli.rollout.agent.toolset import ToolCall
from srtcli.tiny_model import chat_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("tok"), tools=True)


def call_text(name, args):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_a_template_that_renders_tools_is_a_chat_format(tok, tmp_path):
    assert chat_format_for(tok)
    assert not chat_format_for(chat_tokenizer(tmp_path))  # plain ChatML shows no tools


def test_calls_are_parsed_in_order(tok):
    fmt = ChatFormat(tok)
    text = "Let me see. " + call_text("calculator", {"expression": "3*4"}) + " and " + \
        call_text("lookup", {"key": "a", "n": 2}) + "<|im_end|>"
    assert fmt.ends_call(text, at_eos=True)
    assert not fmt.ends_call(text, at_eos=False)  # a chat-format turn ends at its eos only
    assert fmt.calls(text) == [ToolCall("calculator", {"expression": "3*4"}), ToolCall("lookup", {"key": "a", "n": 2})]
    assert not fmt.ends_call("No tool needed. <answer>3</answer><|im_end|>", at_eos=True)


@pytest.mark.parametrize("body, error", [
    ('{"name": "calculator", "arguments": {"expression": "3*4"}', "not valid JSON"),
    ('["calculator"]', "JSON object"),
    ('{"arguments": {}}', "no name"),
    ('{"name": "calculator", "arguments": [1, 2]}', "must be a JSON object"),
    ('{"name": "calculator", "arguments": "{bad"}', "not valid JSON"),
])
def test_a_malformed_call_carries_its_error(tok, body, error):
    (call,) = ChatFormat(tok).calls(f"<tool_call>{body}</tool_call><|im_end|>")
    assert call.arguments is None and error in call.error


def test_arguments_written_as_a_json_string_are_accepted(tok):
    body = json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "1+2"})})
    assert ChatFormat(tok).calls(f"<tool_call>{body}</tool_call>") == [ToolCall("calculator", {"expression": "1+2"})]


def test_an_unclosed_call_is_an_error_call(tok):
    calls = ChatFormat(tok).calls(call_text("calculator", {"expression": "1"}) + ' <tool_call>{"name": "x"<|im_end|>')
    assert calls[0] == ToolCall("calculator", {"expression": "1"}) and "without its closing" in calls[1].error


def test_rendered_results_continue_the_conversation_exactly_as_the_template_renders_it(tok):
    fmt = ChatFormat(tok)
    user = [{"role": "user", "content": "Ann has 3 bags of 4 pens."}]
    prompt = tok.apply_chat_template(user, tools=[calculator], tokenize=False, add_generation_prompt=True)
    turn = "Let me work it out. " + call_text("calculator", {"expression": "3*4"})
    calls = fmt.calls(turn + tok.eos_token)
    results = [(calls[0], "12"), (ToolCall("calculator", {"expression": "0"}), "0")]
    second = "So <answer>12</answer>"
    ours = prompt + turn + tok.eos_token + fmt.render(results) + second + tok.eos_token
    conversation = user + [{"role": "assistant", "content": turn}, {"role": "tool", "content": "12"},
                           {"role": "tool", "content": "0"}, {"role": "assistant", "content": second}]
    theirs = tok.apply_chat_template(conversation, tools=[calculator], tokenize=False)
    assert ours == theirs.rstrip("\n")  # the template closes the last turn with a newline; eos ends ours


def test_structured_tool_calls_render_as_the_model_writes_them(tok):
    """The template renders an assistant message's `tool_calls` the way the model writes a call,
    so a conversation stored as structured messages and a sampled turn tokenize the same."""
    args = {"expression": "3*4"}
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Hm. ",
             "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": args}}]}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert "Hm. " + call_text("calculator", args) + "<|im_end|>" in text


def test_tag_format_is_the_bundled_calculator_syntax():
    fmt = TagFormat()
    assert fmt.ends_call("Compute <calc>2*(3+4)</calc>", at_eos=False)
    assert not fmt.ends_call("Compute <calc>2*(3+4)", at_eos=False)
    assert fmt.calls("Compute <calc>2*(3+4)</calc>") == [ToolCall("calculator", {"expression": "2*(3+4)"})]
    assert fmt.render([(ToolCall("calculator", {}), "14")]) == "<result>14</result>"


HERMES_RESPONSE = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "content": {},
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json", "repeats": True,
                       "transform": {"type": "function", "function": "{content}"}},
    },
}


def test_a_tokenizer_response_template_parses_the_calls(tmp_path):
    """With transformers' prefix-reading `parse_response` the template parses; before it (5.10),
    the template is left unused and the same calls are read as Hermes JSON."""
    tok = chat_tokenizer(tmp_path, tools=True)
    tok.response_template = HERMES_RESPONSE
    fmt = ChatFormat(tok)
    takes_prefix = parses_with_prefix(tok)
    assert fmt.template == (HERMES_RESPONSE if takes_prefix else None)
    prefix = tok.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    text = "Hm. " + call_text("calculator", {"expression": "3*4"}) + call_text("b", {}) + "<|im_end|>"
    assert fmt.calls(text, prefix) == [ToolCall("calculator", {"expression": "3*4"}), ToolCall("b", {})]
    (bad,) = fmt.calls('<tool_call>{"name": oops</tool_call><|im_end|>', prefix)
    assert bad.arguments is None and bad.error and "\n" not in bad.error
    assert ("could not be parsed" if takes_prefix else "not valid JSON") in bad.error
