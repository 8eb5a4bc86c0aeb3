"""Rewards: `exact_match`, `math_answer`, answer extraction, and loading `--reward MODULE:FUNCTION`
with one-line errors."""

import subprocess
import sys
import textwrap

import pytest

from srtcli.errors import SrtError
from fractions import Fraction

from srtcli.rollout.rewards import exact_match, extract_answer, final_number, load_reward, math_answer

REC = {"id": "p1", "prompt": "What is 3*4?", "answer": "12"}


def test_extract_answer_takes_the_last_complete_answer():
    assert extract_answer("<answer>12</answer>") == "12"
    assert extract_answer("think <answer> 7 </answer> no, <answer>12</answer>") == "12"
    assert extract_answer("<answer>12") is None
    assert extract_answer("nothing") is None


@pytest.mark.parametrize(
    "text, reward",
    [
        ("<calc>3*4</calc><result>12</result> So <answer>12</answer>", 1.0),
        ("<answer>012</answer>", 1.0),  # the same integer
        ("<answer>13</answer>", 0.0),
        ("<calc>3*4</calc><result>12</result>", 0.0),  # used the tool but never answered
        ("<answer>12</answer> wait <answer>11</answer>", 0.0),  # the final answer counts
        ("<answer>1 2</answer>", 0.0),
    ],
)
def test_exact_match(text, reward):
    assert exact_match(REC, text) == reward


@pytest.mark.parametrize(
    "text, number",
    [
        ("3 + 4 = 7 and 7 * 2 = 14.\n#### 14", 14),
        ("#### 12 first, then 3 more: 15\n#### 15", 15),  # the last ####
        ("so 1,234 pens\n####  1,234", 1234),  # thousands separators
        ("The answer is $\\boxed{42}$.", 42),
        ("#### 9 ... \\boxed{8}", 9),  # #### comes before \boxed
        ("\\boxed{3} and the answer is 4", 3),  # \boxed before "answer is"
        ("Therefore, the answer is: **-3.5** apples", Fraction(-7, 2)),
        ("so the answer is 3/4.", Fraction(3, 4)),
        ("First 12, then 30, so 42 in all.", 42),  # no marker: the last number
        ("no numbers here", None),
    ],
)
def test_final_number_reads_answers_as_math_graders_do(text, number):
    assert final_number(text) == number


def test_math_answer_compares_numbers_not_strings():
    rec = {"id": "p3", "answer": "12"}
    assert math_answer(rec, "3 * 4 = 12\n#### 12") == 1.0
    assert math_answer(rec, "#### 12.0") == 1.0
    assert math_answer({"id": "p4", "answer": 12}, "the answer is 24/2") == 1.0
    assert math_answer(rec, "12 is half of 24, so #### 24") == 0.0  # the marked answer, not the first number
    assert math_answer(rec, "I do not know") == 0.0
    assert load_reward("math_answer") is math_answer
    with pytest.raises(SrtError, match="math_answer: prompt 'p5' has no 'answer'"):
        math_answer({"id": "p5"}, "#### 1")


def test_exact_match_integer_answers_and_a_wrong_variant_fails():
    rec = {"id": "p2", "answer": 12}  # a JSON number works as well as a string
    assert exact_match(rec, "<answer>12</answer>") == 1.0
    # A reward that looks at the first <answer> would be wrong here; exact_match is not.
    first = lambda r, t: float(t.split("<answer>")[1].split("</answer>")[0] == str(r["answer"]))  # noqa: E731
    text = "<answer>12</answer> wait <answer>11</answer>"
    assert first(rec, text) == 1.0 and exact_match(rec, text) == 0.0


def test_exact_match_missing_answer_field():
    with pytest.raises(SrtError, match="prompt 'p3' has no 'answer' field"):
        exact_match({"id": "p3", "prompt": "x"}, "<answer>1</answer>")


def test_load_builtin_and_module(tmp_path, monkeypatch):
    assert load_reward("exact_match") is exact_match
    (tmp_path / "myrew.py").write_text(textwrap.dedent("""
        def length(rec, text):
            return len(text) / 10
        def bad_type(rec, text):
            return "high"
        def boom(rec, text):
            raise KeyError("gold")
        def nan(rec, text):
            return float("nan")
        def numpy_int(rec, text):
            import numpy
            return numpy.int64(1)
        def multiline(rec, text):
            raise ValueError("line one" + chr(10) + "line two")
        NOT_CALLABLE = 3
    """))
    monkeypatch.chdir(tmp_path)  # MODULE:FUNCTION finds modules in the working directory
    monkeypatch.delitem(sys.modules, "myrew", raising=False)
    fn = load_reward("myrew:length")
    assert fn(REC, "abcde") == 0.5
    fn = load_reward(f"{tmp_path / 'myrew.py'}:length")
    assert fn(REC, "abcdefghij") == 1.0
    with pytest.raises(SrtError, match=r"reward myrew:bad_type returned 'high', not a finite number \(prompt 'p1'\)"):
        load_reward("myrew:bad_type")(REC, "")
    with pytest.raises(SrtError, match=r"reward myrew:boom raised KeyError: 'gold' \(prompt 'p1'\)"):
        load_reward("myrew:boom")(REC, "")
    with pytest.raises(SrtError, match="not a finite number"):
        load_reward("myrew:nan")(REC, "")
    assert load_reward("myrew:numpy_int")(REC, "") == 1.0
    with pytest.raises(SrtError, match="raised ValueError: line one line two") as e:
        load_reward("myrew:multiline")(REC, "")
    assert "\n" not in e.value.message
    with pytest.raises(SrtError, match="is not callable"):
        load_reward("myrew:NOT_CALLABLE")
    with pytest.raises(SrtError, match="has no attribute 'nope'"):
        load_reward("myrew:nope")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("exact", "expected a built-in (exact_match, math_answer) or MODULE:FUNCTION"),
        ("a:b:c", "expected a built-in"),
        (":fn", "expected a built-in"),
        ("no_such_module_xyz:fn", "reward module 'no_such_module_xyz' not found"),
        ("missing_file.py:fn", "missing_file.py: reward file not found"),
    ],
)
def test_load_reward_errors_are_one_line(spec, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SrtError) as e:
        load_reward(spec)
    assert message in e.value.message and "\n" not in e.value.message


def test_broken_reward_file_is_one_line(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("def f(:\n")
    with pytest.raises(SrtError, match="broken.py: importing the reward file failed: SyntaxError"):
        load_reward(f"{bad}:f")


def test_reward_error_through_the_cli_has_no_traceback(tmp_path):
    """A reward that cannot be loaded reaches the user as one line and exit 1 from `srt rollout`."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    out = subprocess.run([sys.executable, "-m", "srtcli", "rollout", "--prompts", str(prompts),
                          "--reward", "nope_mod:f", "--out", str(tmp_path / "pool")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip() == "Error: reward module 'nope_mod' not found (nope_mod is not importable)"


def test_rewards_fields_are_checked_against_every_prompt_before_the_rollout(tmp_path):
    from srtcli.rollout.rewards import reward_for_prompts

    with_answers = [(1, {"prompt": "a", "answer": "1"}), (2, {"prompt": "b", "answer": 2})]
    assert reward_for_prompts(None, with_answers, "p.jsonl") is exact_match  # every prompt has an answer
    assert reward_for_prompts(None, [*with_answers, (4, {"prompt": "c"})], "p.jsonl")({}, "x") == 0.0
    with pytest.raises(SrtError, match=r"^p\.jsonl:4: --reward exact_match needs `answer` on every prompt"):
        reward_for_prompts("exact_match", [*with_answers, (4, {"prompt": "c"})], "p.jsonl")
    (tmp_path / "gold.py").write_text("def f(rec, text):\n    return float(rec['gold'] in text)\nf.needs = 'gold'\n")
    fn = reward_for_prompts(f"{tmp_path / 'gold.py'}:f", [(1, {"prompt": "a", "gold": "x"})], "p.jsonl")
    assert fn({"gold": "x"}, "x") == 1.0
    with pytest.raises(SrtError, match=r"^p\.jsonl:3: .* needs `gold`"):
        reward_for_prompts(f"{tmp_path / 'gold.py'}:f", [(3, {"prompt": "a", "answer": "x"})], "p.jsonl")


def test_rollout_with_exact_match_on_prompts_without_answers_writes_nothing(tmp_path):
    """Refused before the model loads (a missing --model is not even reached), naming file and line."""
    from click.testing import CliRunner

    from srtcli.cli import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "What is 3*4?", "answer": "12"}\n\n{"prompt": "What is 2+2?"}\n')
    for model in ([], ["--model", str(tmp_path / "no-model")]):
        r = CliRunner().invoke(cli, ["rollout", "--prompts", str(prompts), "--reward", "exact_match", "-n", "2",
                                     "--out", str(tmp_path / "pool"), "--cache", str(tmp_path / "cache"), *model])
        assert r.exit_code == 1, r.output
        lines = r.output.strip().splitlines()
        assert lines == [f"Error: {prompts}:3: --reward exact_match needs `answer` on every prompt; this line has none"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # no pool, no cache
