"""Tool calls run off the engine's thread, so a slow tool stalls only the row that called it.

`ToolRunner.start` takes one model turn's calls. With a worker pool (`workers` > 0) it returns a
`ToolTurn` at once: the row leaves the batch (the engine keeps its KV cache and skips it) while
its calls run one after another in the pool (an environment sees them in order), and re-enters
when `poll()` hands back the rendered result tokens; the other rows keep generating meanwhile.
A call that runs past `timeout` seconds gets the result `error: ... timed out` and the turn goes
on; its thread cannot be killed and finishes in the background while a new worker takes its
place (workers are daemon threads: a call that never returns cannot keep srt from exiting; the
sandboxed tool bounds its own time, so it never leaves one). With `workers` = 0, or for inline tools, calls run at once
in the caller's thread.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from srtcli.rollout.agent.toolset import ToolCall, ToolSession

Finish = Callable[[list[tuple[ToolCall, str]]], Any]  # the results -> the row's next tokens


class Workers:
    """Daemon threads running submitted calls. Daemons, unlike ThreadPoolExecutor's threads, are
    not joined at exit, so a tool that never returns cannot keep srt from ending; and a worker
    stuck in such a call is replaced (`add`), so the pool keeps its size."""

    def __init__(self, n: int):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        for _ in range(n):
            self.add()

    def add(self) -> None:
        t = threading.Thread(target=self._work, name=f"srt-tool-{len(self.threads)}", daemon=True)
        t.start()
        self.threads.append(t)

    def submit(self, fn: Callable, arg: Any) -> Future:
        future: Future = Future()
        self.jobs.put((fn, arg, future))
        return future

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, arg, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(arg))
                except BaseException as e:  # handed to whoever polls the future
                    future.set_exception(e)

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)


class ToolRunner:
    """A worker pool for tool calls with a time limit per call."""

    def __init__(self, workers: int, timeout: float):
        self.pool = Workers(workers) if workers > 0 else None
        self.timeout = timeout
        self.changed = threading.Condition()
        self.ready: set[ToolTurn] = set()  # turns whose running call finished since their last poll

    def start(self, session: ToolSession, calls: list[ToolCall], finish: Finish, inline: bool = False) -> Any:
        """The turn's result tokens now (inline), or a `ToolTurn` to poll."""
        if self.pool is None or inline:
            return finish([(c, session.call(c)) for c in calls])
        return ToolTurn(self, session, calls, finish)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class ToolTurn:
    """One turn's calls in flight: `poll()` is None until every call has a result."""

    def __init__(self, runner: ToolRunner, session: ToolSession, calls: list[ToolCall], finish: Finish):
        self.runner, self.session, self.calls, self.finish = runner, session, calls, finish
        self.results: list[tuple[ToolCall, str]] = []
        self._submit()

    def _submit(self) -> None:
        self.started: float | None = None
        self.future = self.runner.pool.submit(self._run, self.calls[len(self.results)])

    def _run(self, call: ToolCall) -> str:
        self.started = time.monotonic()
        try:
            return self.session.call(call)
        finally:
            with self.runner.changed:
                self.runner.ready.add(self)
                self.runner.changed.notify_all()

    def poll(self) -> Any:
        """The row's next tokens (or a finish reason) once every call is answered, else None."""
        with self.runner.changed:
            self.runner.ready.discard(self)
        while len(self.results) < len(self.calls):
            call = self.calls[len(self.results)]
            if self.future.done():
                self.results.append((call, self.future.result()))
            elif self.started is not None and time.monotonic() - self.started > self.runner.timeout:
                self.results.append((call, f"error: the tool call timed out after {self.runner.timeout:g} s"))
                self.runner.pool.add()  # the stuck worker's stand-in
            else:
                return None
            if len(self.results) < len(self.calls):
                self._submit()
        return self.finish(self.results)

    def wait(self, seconds: float) -> None:
        """Block until some call of this runner finishes, or `seconds` pass (a deadline may be due)."""
        with self.runner.changed:
            if not self.runner.ready:
                self.runner.changed.wait(seconds)
