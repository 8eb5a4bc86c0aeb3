"""Tool files the agent tests write for `--tools FILE.py:NAME` (as source, so each test gets a
real file): a slow exact calculator that can mark when a call is running, and an environment
whose reward is whether a call returned the answer."""

SLOW_TOOLS_PY = '''
import os, time
from pathlib import Path
from srtcli.rollout.agent.calculator import calculator as exact


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression exactly, slowly.

    Args:
        expression: the expression
    """
    marker = os.environ.get("SRT_TEST_MARKER")
    if marker:
        Path(marker).write_text(expression)
    time.sleep(float(os.environ.get("SRT_TEST_SLEEP", "0.01")))
    return exact(expression)


class Arith:
    """An environment whose reward is 1 if a call returned the prompt's answer."""

    def reset(self, answer=None, **kwargs):
        self.answer, self.calls = answer, []

    def calculator(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression exactly.

        Args:
            expression: the expression
        """
        self.calls.append(exact(expression))
        return self.calls[-1]

    def get_reward(self) -> float:
        return 1.0 if str(self.answer) in self.calls else 0.0
'''
