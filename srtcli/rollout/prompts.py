"""Reading the prompts file of `srt rollout`: JSONL, one prompt per line, validated.

Each line is an object with `prompt` (a string, or a list of chat messages `{"role",
"content"}`), optional `id` (default: `line-N`) and optional `answer` (for `exact_match`).
Chat messages are rendered with the tokenizer's chat template (add_generation_prompt=True); a
string is rendered as one user message when the tokenizer has a chat template (the bundled
model was trained that way), else tokenized as it is (srtcli.tokenizers.encode_prompt).
Every problem is a one-line `SrtError` naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError, at
from srtcli.jsonl import read_lines
from srtcli.tokenizers import encode_prompt


@dataclass
class PromptRecord:
    """One prompt line: the raw record (for rewards), its id and its token ids."""

    line: int
    record: dict[str, Any]
    id: str
    ids: list[int]


def _messages_ok(msgs: Any) -> bool:
    return isinstance(msgs, list) and bool(msgs) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in msgs
    )


def render(tokenizer: Any, prompt: Any, tools: list[dict] | None = None) -> list[int]:
    """Token ids of a prompt (string or chat messages); ValueError with a short reason.

    Encoding is `srtcli.tokenizers.encode_prompt`, the one every cache writer uses, so a
    prompt always gets the same cache uid."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("`prompt` is empty")
    elif not _messages_ok(prompt):
        raise ValueError("`prompt` must be a string or a non-empty list of {role, content} messages")
    return [int(t) for t in encode_prompt(tokenizer, prompt, tools)]


def read_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of each prompt line, checked as JSON only (no tokenizer needed).

    Enough to check a reward's fields before the model loads; `read_prompts` does the rest."""
    path = Path(path)
    if not path.exists():
        raise SrtError(f"{path}: prompts file not found")
    if path.is_dir():
        raise SrtError(f"{path}: a directory, not a JSONL prompts file")
    out = []
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise at(path, lineno, f"malformed JSON ({e.msg})") from None
        if not isinstance(rec, dict) or "prompt" not in rec:
            raise at(path, lineno, "each line must be an object with a `prompt` field")
        if "id" in rec and not isinstance(rec["id"], (str, int)):
            raise at(path, lineno, "`id` must be a string or an integer")
        out.append((lineno, rec))
    if not out:
        raise SrtError(f"{path}: no prompts (the file is empty)")
    return out


def read_prompts(path: str | Path, tokenizer: Any, max_prompt_tokens: int,
                 tools: list[dict] | None = None) -> list[PromptRecord]:
    """All prompts of a JSONL file, validated and tokenized (errors name file and line); `tools`
    (JSON schemas) are shown to the model by the chat template."""
    path = Path(path)
    out: list[PromptRecord] = []
    seen: dict[tuple[int, ...], int] = {}
    # srt checks the length below, naming the line; transformers' own warning ("Token indices
    # sequence length is longer ...") would only precede that error, so it is marked as given
    getattr(tokenizer, "deprecation_warnings", {})["sequence-length-is-longer-than-the-specified-maximum"] = True
    for lineno, rec in read_records(path):
        try:
            ids = render(tokenizer, rec["prompt"], tools)
        except ValueError as e:
            raise at(path, lineno, str(e)) from None
        if not ids:
            raise at(path, lineno, "the prompt renders to no tokens")
        if len(ids) > max_prompt_tokens:
            raise at(path, lineno, f"the prompt has {len(ids)} tokens; the model's context allows "
                                   f"at most {max_prompt_tokens} before generation")
        first = seen.setdefault(tuple(ids), lineno)
        if first != lineno:  # same ids = same cache uid and pool group: it would merge two groups
            raise at(path, lineno, f"duplicate of line {first} (the same prompt); -n sets samples per prompt")
        out.append(PromptRecord(lineno, rec, str(rec.get("id", f"line-{lineno}")), ids))
    return out
