"""The sandboxed Python tool: the model writes Python, a contained child process runs it.

`python(code)` is the tool as the chat template sees it (a typed function with a docstring, like
every user tool: `--tools srtcli.rollout.agent.sandbox:python`); it returns the text the model
reads and never raises for anything the code does. `run_sandboxed(code, limits)` underneath
returns a `SandboxResult`. Each call gets a fresh scratch directory (cwd, HOME and TMPDIR, removed
afterwards), a minimal environment, stdin at /dev/null, rlimits, and whatever OS containment
`srtcli.rollout.agent.sandbox_isolation` can enter on this machine (namespaces, read-only mounts,
an unprivileged uid; `SandboxResult.layers` says which), in the child process of
`srtcli.rollout.agent.sandbox_child`, which leads a process group of its own: at the wall-clock
limit, and after the child exits, everything it started is killed before the call returns.
Calls share no state, so threads may make them concurrently.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from srtcli.errors import SrtError

CHILD = Path(__file__).with_name("sandbox_child.py")
MB = 1 << 20
# How long output is still read after the child ends (a straggler may hold the pipes open).
DRAIN_S = 0.5
RLIMIT_FIELDS = ("cpu_time_s", "memory_bytes", "max_processes", "max_file_bytes", "max_open_files")


class SandboxError(SrtError):
    """The sandbox itself could not run (no scratch directory, no interpreter): not the code's fault."""


@dataclass(frozen=True)
class Limits:
    """What one call may use; None switches a limit off.

    memory_bytes is address space per process (RLIMIT_AS): 512 MB runs plain Python and numpy;
    max_processes counts processes and threads of the call's user (RLIMIT_NPROC, which root
    ignores: the child drops root first where it can); output is cut to max_output_chars each
    for stdout and stderr, keeping the head and the tail.
    """

    wall_time_s: float = 5.0
    cpu_time_s: int | None = 5
    memory_bytes: int | None = 512 * MB
    max_processes: int | None = 32
    max_file_bytes: int | None = 16 * MB
    max_open_files: int | None = 64
    max_output_chars: int = 4000
    isolate: bool = True  # namespaces, read-only mounts, uid nobody: False keeps only the rest
    audit_hook: bool = True  # refuse Python-level sockets and writes outside scratch


@dataclass(frozen=True)
class SandboxResult:
    """What one call did: output (already cut), how it ended, and the containment it ran under."""

    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal; None: stopped at the time limit
    timed_out: bool
    duration_s: float
    layers: tuple[str, ...]  # e.g. ("rlimits", "network-namespace", ..., "audit-hook")


class _Capture:
    """A stream's first and last `keep` bytes and its total size; memory stays bounded."""

    def __init__(self, keep: int) -> None:
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        self.head += data[:room]
        self.tail = (self.tail + data[room:])[-self.keep:] if len(data) > room else self.tail

    def text(self, max_chars: int) -> str:
        """The stream as text, cut to its first and last max_chars/2 characters if longer."""
        if self.total == len(self.head) + len(self.tail):
            head = tail = (self.head + self.tail).decode(errors="replace")
            if len(head) <= max_chars:
                return head
        else:
            head, tail = self.head.decode(errors="replace"), self.tail.decode(errors="replace")
        half = max_chars // 2
        return f"{head[:half]}\n[... output cut: {self.total} bytes in all ...]\n{tail[len(tail) - half:]}"


def outcome_note(result: SandboxResult, limits: Limits) -> str:
    """One line saying how the run ended, or "" for a clean exit."""
    last = result.stderr.rstrip().rsplit("\n", 1)[-1]
    if result.timed_out:
        return f"[stopped: the {limits.wall_time_s:g} s time limit was reached]"
    if result.returncode == -signal.SIGXCPU or (result.returncode == -signal.SIGKILL and limits.cpu_time_s
                                                 and result.duration_s >= limits.cpu_time_s):
        return f"[stopped: the {limits.cpu_time_s} s CPU-time limit was reached]"
    if last.startswith("MemoryError") and limits.memory_bytes is not None:
        return f"[failed: the {limits.memory_bytes // MB} MB memory limit was reached]"
    if result.returncode is not None and result.returncode < 0:
        try:
            return f"[killed by signal {signal.Signals(-result.returncode).name}]"
        except ValueError:
            return f"[killed by signal {-result.returncode}]"
    return f"[exit status {result.returncode}]" if result.returncode else ""


def as_tool_output(result: SandboxResult, limits: Limits) -> str:
    """What the model reads: stdout, then stderr, then how it ended (if not cleanly)."""
    parts = [t if t.endswith("\n") else t + "\n" for t in (result.stdout, result.stderr) if t]
    note = outcome_note(result, limits)
    text = "".join(parts) + (note + "\n" if note else "")
    return text if text else "[no output]\n"


DEFAULT_LIMITS = Limits()


def python(code: str) -> str:
    """Run Python code in a sandbox and return what it printed (stdout, then stderr).

    Each call starts a fresh interpreter (nothing carries over between calls) in an empty
    directory, without network, limited to 5 seconds and 512 MB. Print what you want to see.

    Args:
        code: a complete Python program, for example print(sum(range(10)))
    """
    result = run_sandboxed(str(code), DEFAULT_LIMITS)
    return as_tool_output(result, DEFAULT_LIMITS)


def minimal_env(scratch: str) -> dict[str, str]:
    """Nothing inherited: no secrets, no proxies, no PYTHON* settings."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def run_sandboxed(code: str, limits: Limits = Limits()) -> SandboxResult:
    """Run `code` in a contained child and return what happened; raises only SandboxError."""
    try:
        scratch = tempfile.mkdtemp(prefix="srt-sandbox-")
    except OSError as e:
        raise SandboxError(f"sandbox: cannot create a scratch directory: {e}") from e
    try:
        return _run_in(os.path.realpath(scratch), code, limits)
    finally:
        remove_scratch(scratch)


def _run_in(scratch: str, code: str, limits: Limits) -> SandboxResult:
    report_r, report_w = os.pipe()
    request = {"code": code, "scratch": scratch, "report_fd": report_w, "isolate": limits.isolate,
               "audit_hook": limits.audit_hook,
               "limits": {k: v for k, v in asdict(limits).items() if k in RLIMIT_FIELDS}}
    start = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-u", str(CHILD)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=scratch,
                                env=minimal_env(scratch), pass_fds=(report_w,), start_new_session=True)
    except OSError as e:
        os.close(report_r)
        raise SandboxError(f"sandbox: cannot start {sys.executable}: {e}") from e
    finally:
        os.close(report_w)
    try:
        _send(proc, json.dumps(request).encode())
        out, err, timed_out = _collect(proc, start + limits.wall_time_s, 4 * limits.max_output_chars)
    finally:
        layers = _read_report(report_r)  # written before the code started, so there by now
        stop(proc, "pid-namespace" in layers)
    if not layers and not timed_out:  # it failed before running any of the code
        raise SandboxError(f"sandbox: the child process failed: {err.text(500).strip() or proc.returncode}")
    return SandboxResult(out.text(limits.max_output_chars), err.text(limits.max_output_chars),
                         None if timed_out else proc.returncode, timed_out,
                         time.monotonic() - start, layers)


def _send(proc: subprocess.Popen, request: bytes) -> None:
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died at once; its stderr says why


def _collect(proc: subprocess.Popen, deadline: float, keep: int) -> tuple[_Capture, _Capture, bool]:
    """Read stdout and stderr until the child ended and both closed (or DRAIN_S passed), or until
    the deadline; whether the deadline stopped it."""
    captures = {proc.stdout: _Capture(keep), proc.stderr: _Capture(keep)}
    ended_at = None
    with selectors.DefaultSelector() as sel:
        for stream in captures:
            sel.register(stream, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if ended_at is None and _has_exited(proc):
                ended_at = now
                kill_group(proc)  # stragglers (a background child) must not outlive the call
            if ended_at is not None and (not sel.get_map() or now - ended_at > DRAIN_S):
                return captures[proc.stdout], captures[proc.stderr], False
            if now >= deadline:
                return captures[proc.stdout], captures[proc.stderr], ended_at is None
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                data = os.read(key.fd, 65536)
                if data:
                    captures[key.fileobj].add(data)
                else:
                    sel.unregister(key.fileobj)


def _has_exited(proc: subprocess.Popen) -> bool:
    """Exited, but not yet reaped: its pid still names the process group, so killing that is safe."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def stop(proc: subprocess.Popen, supervised: bool) -> None:
    """End the child and everything it started. A PID namespace's supervisor, asked with SIGTERM,
    exits only once the whole namespace is gone; a whole-group SIGKILL then ends what is left
    (everything, where there is no namespace: the code's process leads no group of its own)."""
    if supervised and not _has_exited(proc):
        proc.terminate()
        deadline = time.monotonic() + 1.0
        while not _has_exited(proc) and time.monotonic() < deadline:
            time.sleep(0.01)
    kill_group(proc)  # before the child is reaped, while its pid still names the group
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (the child leads it: start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(fd: int) -> tuple[str, ...]:
    try:
        os.set_blocking(fd, False)
        return tuple(json.loads(os.read(fd, 65536) or b"[]"))
    except (OSError, ValueError):
        return ()  # the child died before reporting
    finally:
        os.close(fd)


def remove_scratch(path: str) -> None:
    """Remove the scratch directory, also where the code made parts of it unreadable to us."""
    try:
        shutil.rmtree(path)
    except OSError:
        os.chmod(path, 0o700)
        for root, dirs, _ in os.walk(path):  # top-down: a directory is opened before it is listed
            for d in (os.path.join(root, d) for d in dirs):
                if not os.path.islink(d):  # chmod follows links: never touch what a link points to
                    os.chmod(d, 0o700)
        shutil.rmtree(path, ignore_errors=True)
