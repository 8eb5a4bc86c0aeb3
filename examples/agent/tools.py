"""The agent example's tools, for `--tools FILE.py:NAME`: the calculator, as a plain typed function.

    srt rollout --prompts examples/arith/prompts.jsonl --model examples/agent/model --tools examples/agent/tools.py:TOOLS

Any list of functions with type hints and a docstring (an `Args:` section) works the same way:
the chat template shows their JSON schemas (`transformers.utils.get_json_schema`) in the system
turn, and rollout runs the calls the model writes as `<tool_call>{"name", "arguments"}</tool_call>`.
"""

from srtcli.rollout.agent.calculator import calculator

TOOLS = [calculator]
