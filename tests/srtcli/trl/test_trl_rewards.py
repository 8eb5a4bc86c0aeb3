"""srt's rewards as TRL reward functions (`trl_reward`): TRL's call shape, chat or plain
completions, the dataset's columns as each row's record."""

from __future__ import annotations

import pytest

from srtcli.errors import SrtError
from srtcli.trl.rewards import trl_reward


def test_a_builtin_scores_trls_batches():
    fn = trl_reward("math_answer")
    chat = [[{"role": "assistant", "content": "7 + 5 = 12\n#### 12"}], [{"role": "assistant", "content": "#### 11"}]]
    assert fn(["q1", "q2"], chat, answer=["12", "12"]) == [1.0, 0.0]
    assert fn(["q1"], ["the answer is 12"], answer=["12"], trainer_state=object()) == [1.0]
    assert trl_reward("exact_match")(["q"], ["<answer>3</answer>"], answer=[3]) == [1.0]


def test_a_user_reward_gets_each_rows_columns(tmp_path, monkeypatch):
    (tmp_path / "myreward.py").write_text("def fn(rec, text):\n    return float(rec['gold'] in text)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = trl_reward("myreward:fn")
    assert fn(["a", "b"], ["x yes", "no"], gold=["yes", "yes"]) == [1.0, 0.0]


def test_a_missing_column_is_one_line():
    with pytest.raises(SrtError, match="reward math_answer needs the dataset column"):
        trl_reward("math_answer")(["q"], ["#### 1"], solution=["1"])
