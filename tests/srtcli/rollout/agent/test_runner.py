"""The tool runner: calls run in a worker pool so slow tools overlap, each turn's calls in order,
a call past its time limit becomes an error result, and inline mode runs at once."""

from __future__ import annotations

import threading
import time

from srtcli.rollout.agent.runner import ToolRunner
from srtcli.rollout.agent.toolset import ToolCall, ToolSession


def finish(results):
    return [text for _, text in results]


def wait_all(turns, limit=10.0):
    out, end = {}, time.monotonic() + limit
    while len(out) < len(turns) and time.monotonic() < end:
        for i, t in enumerate(turns):
            if i not in out:
                r = t.poll()
                if r is not None:
                    out[i] = r
        if len(out) < len(turns):
            turns[0].wait(0.05)
    return [out.get(i) for i in range(len(turns))]


def sleeper(log):
    def nap(seconds: float) -> str:
        log.append(("start", seconds, threading.current_thread().name))
        time.sleep(seconds)
        return f"slept {seconds}"
    return ToolSession({"nap": nap}, None)


def test_slow_calls_of_different_rows_overlap():
    runner, log = ToolRunner(workers=4, timeout=5), []
    t0 = time.monotonic()
    turns = [runner.start(sleeper(log), [ToolCall("nap", {"seconds": 0.3})], finish) for _ in range(4)]
    assert all(t.poll() is None for t in turns)  # handed back at once; the engine goes on
    assert wait_all(turns) == [["slept 0.3"]] * 4
    assert time.monotonic() - t0 < 0.3 * 4 * 0.6  # overlapped, not one after another
    runner.close()


def test_one_turns_calls_run_in_order():
    runner, order = ToolRunner(workers=4, timeout=5), []

    def step(i: int) -> str:
        time.sleep(0.05 * (3 - i))  # later calls are faster: order must still hold
        order.append(i)
        return str(i)

    turn = runner.start(ToolSession({"step": step}, None), [ToolCall("step", {"i": i}) for i in range(3)], finish)
    assert wait_all([turn]) == [["0", "1", "2"]] and order == [0, 1, 2]
    runner.close()


def test_a_call_past_its_time_limit_is_an_error_and_the_turn_goes_on():
    runner = ToolRunner(workers=2, timeout=0.2)
    calls = [ToolCall("nap", {"seconds": 2.0}), ToolCall("nap", {"seconds": 0.01})]
    t0 = time.monotonic()
    (out,) = wait_all([runner.start(sleeper([]), calls, finish)])
    assert out == ["error: the tool call timed out after 0.2 s", "slept 0.01"]
    assert time.monotonic() - t0 < 1.5
    runner.close()


def test_inline_and_zero_workers_run_in_the_callers_thread():
    log = []
    for runner, inline in ((ToolRunner(workers=0, timeout=1), False), (ToolRunner(workers=2, timeout=1), True)):
        assert runner.start(sleeper(log), [ToolCall("nap", {"seconds": 0.0})], finish, inline=inline) == ["slept 0.0"]
        runner.close()
    assert {name for _, _, name in log} == {threading.current_thread().name}


def test_a_call_that_never_returns_is_replaced_and_does_not_hold_the_process(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import threading, time
        from srtcli.rollout.agent.runner import ToolRunner
        from srtcli.rollout.agent.toolset import ToolCall, ToolSession
        runner = ToolRunner(workers=1, timeout=0.2)
        hang = ToolSession({"hang": lambda: threading.Event().wait(), "ok": lambda: "fine"}, None)
        turn = runner.start(hang, [ToolCall("hang", {})], lambda r: [t for _, t in r])
        while (out := turn.poll()) is None:
            turn.wait(0.05)
        print(out[0])
        turn = runner.start(hang, [ToolCall("ok", {})], lambda r: [t for _, t in r])  # the one worker is stuck
        while (out := turn.poll()) is None:
            turn.wait(0.05)
        print(out[0])
    ''')
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["error: the tool call timed out after 0.2 s", "fine"]
    assert time.monotonic() - t0 < 30  # the hung thread did not keep the interpreter alive
