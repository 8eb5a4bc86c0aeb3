"""Reward functions for `srt rollout --reward`: the built-ins and user functions.

Built-ins: `exact_match` (the bundled workload's `<answer>VALUE</answer>` tags) and
`math_answer` (a worked solution's final number, read as math graders read it: after "####", in
`\\boxed{}`, after "answer is", else the last number; the real-model workload's reward).

A reward function is `fn(prompt_record: dict, completion_text: str) -> float`, where
`prompt_record` is the prompt's line of the prompts file (it has `prompt`, `id` and, for the
bundled workload, `answer`) and `completion_text` is everything the model and its tools wrote
after the prompt (all turns, tool results included).

    fn = load_reward("exact_match")       # a built-in name
    fn = load_reward("mypkg.rewards:fn")  # or MODULE:FUNCTION, or path/to/file.py:FUNCTION
    r = fn(record, text)                  # float; user errors become one-line SrtErrors

`reward_for_prompts(spec, records, path)` also checks, before anything is generated, that every
prompt has the fields the function declares in its `needs` attribute (`exact_match` needs
`answer`; a user function may set `fn.needs = ("gold",)`).

`load_reward` wraps user functions so that an exception inside one, or a value that is not a
finite number, is reported as one line naming the function and the prompt id, instead of a
traceback halfway through a rollout.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction
from typing import Any, Callable

from srtcli.errors import SrtError, at
from srtcli.user_code import load_target, one_line

RewardFn = Callable[[dict, str], float]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The value of the last complete `<answer>VALUE</answer>` in `text`, stripped; or None."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def _normalize(value: Any) -> str:
    text = str(value).strip()
    # "007", "+7" and "7" are the same integer; anything else compares as text.
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    return text


def exact_match(prompt_record: dict, completion_text: str) -> float:
    """1.0 if the completion's final `<answer>` equals the record's `answer`, else 0.0."""
    if "answer" not in prompt_record:
        pid = prompt_record.get("id", "?")
        raise SrtError(f"exact_match: prompt {pid!r} has no 'answer' field")
    got = extract_answer(completion_text)
    if got is None:
        return 0.0
    return 1.0 if _normalize(got) == _normalize(prompt_record["answer"]) else 0.0


exact_match.needs = ("answer",)  # checked on every prompt before the rollout starts

# a number as math answers write it: a sign, digits with optional thousands commas, a decimal
# part, or a fraction (3/4)
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+"
_AFTER_HASHES = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")
_BOXED = re.compile(r"\\boxed\s*\{\s*\$?\s*(" + _NUMBER + r")\s*\}")
_ANSWER_IS = re.compile(r"answer\s+is\s*[:=]?\s*\$?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_ANY = re.compile(_NUMBER)


def final_number(text: str) -> Fraction | None:
    """The final answer of a worked solution, read the way math graders read it: the number after
    the last "####", else in the last `\\boxed{}`, else after the last "answer is", else the last
    number in the text; None if there is none."""
    for pattern in (_AFTER_HASHES, _BOXED, _ANSWER_IS, _ANY):
        found = pattern.findall(text)
        if found:
            return _as_number(found[-1])
    return None


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(re.sub(r"[\s,]", "", text))
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(prompt_record: dict, completion_text: str) -> float:
    """1.0 if the completion's final number (`final_number`) equals the record's `answer` as a
    number (42, 42.0 and 84/2 are equal), else 0.0."""
    if "answer" not in prompt_record:
        pid = prompt_record.get("id", "?")
        raise SrtError(f"math_answer: prompt {pid!r} has no 'answer' field")
    want = _as_number(str(prompt_record["answer"]).strip())
    got = final_number(completion_text)
    return 1.0 if got is not None and got == want else 0.0


math_answer.needs = ("answer",)
BUILTIN: dict[str, RewardFn] = {"exact_match": exact_match, "math_answer": math_answer}


def _no_reward(prompt_record: dict, completion_text: str) -> float:
    return 0.0


def needed_fields(fn: RewardFn) -> tuple[str, ...]:
    """The prompt-record fields a reward function declares it reads (its `needs`: a name or a tuple)."""
    needs = getattr(fn, "needs", ()) or ()
    return (needs,) if isinstance(needs, str) else tuple(needs)


def reward_for_prompts(spec: str | None, records: list[tuple[int, dict]], path: Any) -> RewardFn:
    """The reward of a rollout, checked against the prompts before anything is generated.

    `spec` None: `exact_match` when every prompt has an `answer`, else a reward of 0. A reward
    function's `needs` attribute (a tuple of field names; `exact_match` needs `answer`) must be
    present on every prompt record, else a one-line error naming the prompts file and line."""
    if spec is None:
        if not all("answer" in rec for _, rec in records):
            return _no_reward
        spec = "exact_match"
    fn = load_reward(spec)
    needs = needed_fields(fn)
    for lineno, rec in records:
        missing = [f for f in needs if f not in rec]
        if missing:
            fields = ", ".join(f"`{f}`" for f in missing)
            raise at(path, lineno, f"--reward {spec} needs {fields} on every prompt; this line has none")
    return fn


def _checked(spec: str, fn: Callable) -> RewardFn:
    def reward(prompt_record: dict, completion_text: str) -> float:
        pid = prompt_record.get("id", "?")
        try:
            value = fn(prompt_record, completion_text)
        except SrtError:
            raise
        except Exception as e:
            raise SrtError(f"reward {spec} raised {type(e).__name__}: {one_line(e)} (prompt {pid!r})") from None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise SrtError(f"reward {spec} returned {value!r}, not a finite number (prompt {pid!r})")
        return float(value)

    reward.__name__ = getattr(fn, "__name__", "reward")
    reward.needs = getattr(fn, "needs", ())
    reward.__doc__ = getattr(fn, "__doc__", None)
    return reward


def load_reward(spec: str) -> RewardFn:
    """A reward function from a built-in name or `MODULE:FUNCTION` / `FILE.py:FUNCTION`."""
    spec = spec.strip()
    if spec in BUILTIN:
        return BUILTIN[spec]
    fn = load_target(spec, "--reward", list(BUILTIN), "reward", "MODULE:FUNCTION")
    if not callable(fn):
        raise SrtError(f"reward {spec}: {spec.split(':')[1]!r} is not callable")
    return _checked(spec, fn)


__all__ = ["RewardFn", "BUILTIN", "exact_match", "extract_answer", "final_number", "load_reward", "math_answer",
           "needed_fields", "reward_for_prompts"]
