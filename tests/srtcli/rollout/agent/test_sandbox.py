"""The sandboxed Python tool, with real child processes.

Each containment test proves containment with the mechanism this machine gives the sandbox
(`SandboxResult.layers`) and skips, saying why, only where that mechanism is unavailable. Writes
and connections are tried twice: through ctypes with the audit hook off (only the OS can stop
them) and through Python with the OS isolation off (only the audit hook can); a third run with
both off shows the same attempt succeeds, so the tests can fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from transformers.utils import get_json_schema

from srtcli.rollout.agent.sandbox import MB, Limits, as_tool_output, python, run_sandboxed

LIMITS = Limits(wall_time_s=2.0, cpu_time_s=2, memory_bytes=256 * MB, max_processes=16)
PYTHON_ONLY = replace(LIMITS, isolate=False)  # the audit hook alone
OS_ONLY = replace(LIMITS, audit_hook=False)  # the OS containment alone
NOTHING = replace(LIMITS, isolate=False, audit_hook=False)

CTYPES_CREATE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.open({path!r}.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
print("created" if fd >= 0 else "refused: " + os.strerror(ctypes.get_errno()))
"""
CONNECT = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
    print("connected")
except OSError as e:
    print("refused:", e)
"""


@pytest.fixture(scope="module")
def layers() -> tuple[str, ...]:
    return run_sandboxed("", LIMITS).layers


def require(layers: tuple[str, ...], *any_of: str) -> None:
    if not set(any_of) & set(layers):
        pytest.skip(f"this machine gives the sandbox none of {any_of} (it has {layers})")


def survivors(scratch: str, layers: tuple[str, ...]) -> list[int]:
    """Processes still working in a call's scratch directory: at once where a PID namespace ended
    them all before the call returned, else after a short grace for the group's SIGKILL."""
    deadline = time.monotonic() + (0.0 if "pid-namespace" in layers else 1.0)
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(scratch):
                    found.append(int(pid))
            except OSError:
                pass  # gone, a zombie, or not ours to inspect
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture
def open_dir():
    """A directory anyone may write to, on a path anyone may enter: only the sandbox can stop a write."""
    base = tempfile.gettempdir()
    if not all(os.stat(p).st_mode & stat.S_IXOTH for p in [base, *map(str, Path(base).parents)]):
        pytest.skip(f"{base} is not reachable for other users here")
    path = tempfile.mkdtemp(prefix="srt-sandbox-test-")
    os.chmod(path, 0o777)
    yield Path(path)
    shutil.rmtree(path)


@pytest.fixture
def server():
    with socket.create_server(("127.0.0.1", 0)) as s:
        s.settimeout(0.2)
        yield s


def accepted(s: socket.socket) -> bool:
    try:
        s.accept()[0].close()
        return True
    except TimeoutError:
        return False


def test_the_tool_is_a_typed_function_with_a_schema() -> None:
    schema = get_json_schema(python)["function"]
    assert schema["name"] == "python" and schema["description"].startswith("Run Python code")
    assert schema["parameters"]["properties"]["code"]["type"] == "string"
    assert schema["parameters"]["required"] == ["code"]


def test_normal_code_prints_its_output() -> None:
    assert python("print(6 * 7)") == "42\n"
    assert python("x = 1") == "[no output]\n"


def test_a_syntax_error_and_an_exception_come_back_as_text() -> None:
    syntax = python("x = (")
    assert "SyntaxError" in syntax and syntax.endswith("[exit status 1]\n")
    crash = python("print('before')\n1 / 0")
    assert crash.startswith("before\nTraceback (most recent call last):\n")
    assert 'File "<code>", line 2' in crash and "ZeroDivisionError: division by zero" in crash
    assert "sandbox_child" not in crash  # the traceback is the code's own


@pytest.mark.parametrize("code", ["\0", "import sys; sys.stdout.close()", "raise SystemExit('bye')",
                                  "import os; os._exit(0)", "raise KeyboardInterrupt", "input()",
                                  "import os; os.close(1); os.close(2)", "print('\\udcff')", "'\udcff'", "None"])
def test_the_tool_never_raises_for_what_the_code_does(code: str) -> None:
    assert isinstance(python(code), str)


def test_stdin_is_closed() -> None:
    assert "EOFError" in run_sandboxed("input()", LIMITS).stderr


def test_an_infinite_loop_is_stopped_at_the_time_limit() -> None:
    limits = replace(LIMITS, wall_time_s=1.0, cpu_time_s=None)
    start = time.monotonic()
    result = run_sandboxed("print('started')\nwhile True: pass", limits)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 2.0
    assert as_tool_output(result, limits) == "started\n[stopped: the 1 s time limit was reached]\n"


def test_cpu_time_is_limited() -> None:
    limits = replace(LIMITS, wall_time_s=8.0, cpu_time_s=1)  # wall time to spare on a busy machine
    result = run_sandboxed("while True: pass", limits)
    assert not result.timed_out
    assert as_tool_output(result, limits) == "[stopped: the 1 s CPU-time limit was reached]\n"


def test_a_fork_bomb_is_contained(layers: tuple[str, ...]) -> None:
    require(layers, "process-limit")
    code = "import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = run_sandboxed(code, replace(LIMITS, wall_time_s=1.0))
    assert result.timed_out and time.monotonic() - start < 3.0
    assert survivors(result.stdout.split("\n")[0], layers) == []


def test_processes_stop_at_the_process_limit(layers: tuple[str, ...]) -> None:
    require(layers, "process-limit")
    code = """
import os, time
started = 0
for _ in range(40):
    try:
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
        started += 1
    except OSError:
        break
print(started)
"""
    assert int(run_sandboxed(code, replace(LIMITS, max_processes=8)).stdout) < 8


@pytest.mark.parametrize("detach", [False, True])
def test_no_background_process_outlives_the_call(layers: tuple[str, ...], detach: bool) -> None:
    if detach:  # a new session leaves the process group: only a PID namespace still holds it
        require(layers, "pid-namespace")
    code = f"import os, subprocess\nprint(os.getcwd())\nsubprocess.Popen(['sleep', '100'], start_new_session={detach})"
    result = run_sandboxed(code, LIMITS)
    assert not result.timed_out and result.duration_s < 1.5
    assert survivors(result.stdout.split("\n")[0], layers) == []


@pytest.mark.parametrize("code", ["x = bytearray(10**10)", "x = []\nwhile True: x.append(bytes(10**6))"])
def test_a_huge_allocation_fails_with_the_memory_note(code: str) -> None:
    result = run_sandboxed(code, LIMITS)
    assert "MemoryError" in result.stderr
    assert as_tool_output(result, LIMITS).endswith("[failed: the 256 MB memory limit was reached]\n")


def test_a_write_outside_scratch_is_stopped_by_the_os(layers: tuple[str, ...], open_dir: Path) -> None:
    require(layers, "read-only-fs", "unprivileged-uid")
    # read-only mounts stop even a write anyone may do; uid nobody alone, one others may not
    target = open_dir if "read-only-fs" in layers else Path(tempfile.mkdtemp(dir=open_dir))
    target.chmod(0o777 if "read-only-fs" in layers else 0o755)
    assert run_sandboxed(CTYPES_CREATE.format(path=str(target / "escaped")), OS_ONLY).stdout.startswith("refused")
    assert run_sandboxed(CTYPES_CREATE.format(path="/escaped"), OS_ONLY).stdout.startswith("refused")
    assert not (target / "escaped").exists() and not Path("/escaped").exists()


def test_a_write_outside_scratch_is_stopped_by_the_audit_hook(open_dir: Path) -> None:
    (open_dir / "kept").write_text("")
    code = f"""
import os
for attempt in (lambda: open({str(open_dir / 'escaped')!r}, 'w'), lambda: os.remove({str(open_dir / 'kept')!r})):
    try:
        attempt()
        print("done")
    except PermissionError as e:
        print("refused")
"""
    assert run_sandboxed(code, PYTHON_ONLY).stdout == "refused\nrefused\n"
    assert sorted(p.name for p in open_dir.iterdir()) == ["kept"]


def test_without_containment_the_same_write_succeeds(open_dir: Path) -> None:
    assert run_sandboxed(CTYPES_CREATE.format(path=str(open_dir / "escaped")), NOTHING).stdout == "created\n"
    assert (open_dir / "escaped").exists()


def test_writing_inside_scratch_works() -> None:
    code = "open('a.txt', 'w').write('kept')\nimport os\nprint(open(os.path.join(os.environ['TMPDIR'], 'a.txt')).read())"
    assert run_sandboxed(code, LIMITS).stdout == "kept\n"


def test_no_network_from_the_os(layers: tuple[str, ...], server: socket.socket) -> None:
    require(layers, "network-namespace")
    result = run_sandboxed(CONNECT.format(port=server.getsockname()[1]), OS_ONLY)
    assert result.stdout.startswith("refused") and not accepted(server)


def test_no_network_from_the_audit_hook(server: socket.socket) -> None:
    result = run_sandboxed(CONNECT.format(port=server.getsockname()[1]), PYTHON_ONLY)
    assert result.stdout.startswith("refused: sandbox: no network")
    assert not accepted(server)


def test_without_containment_the_same_connection_succeeds(server: socket.socket) -> None:
    assert run_sandboxed(CONNECT.format(port=server.getsockname()[1]), NOTHING).stdout == "connected\n"
    assert accepted(server)


def test_output_is_cut_keeping_head_and_tail() -> None:
    result = run_sandboxed("print('first'); print('x' * 100000); print('last')", replace(LIMITS, max_output_chars=1000))
    assert result.stdout.startswith("first\nxxx") and result.stdout.endswith("xxx\nlast\n")
    assert "[... output cut: 100012 bytes in all ...]" in result.stdout and len(result.stdout) < 1100


def test_the_environment_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRT_SANDBOX_SECRET", "s3cret")
    code = "import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd())"
    assert run_sandboxed(code, LIMITS).stdout == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']\nTrue\n"


def test_the_scratch_directory_is_removed_even_if_made_unreadable() -> None:
    code = "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').close()\nos.chmod('a', 0)\nos.chmod('.', 0o500)\nprint(os.getcwd())"
    scratch = run_sandboxed(code, LIMITS).stdout.strip()
    assert scratch and not os.path.exists(scratch)


def test_concurrent_calls_are_isolated() -> None:
    code = "import os, time\nopen('me', 'w').write('{i}')\ntime.sleep(0.3)\nprint(open('me').read(), os.getcwd())"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_sandboxed(code.format(i=i), LIMITS), range(4)))
    outputs = [r.stdout.split() for r in results]
    assert [o[0] for o in outputs] == ["0", "1", "2", "3"]
    assert len({o[1] for o in outputs}) == 4
