"""The sandbox's child process: contain itself with what the machine allows, then run the code.

`srtcli.rollout.agent.sandbox` starts this file as a script (`python -I -u sandbox_child.py`,
standard library only, nothing of srt imported but its sibling `sandbox_isolation`, by file) in a
new session, with the request on stdin as one JSON object: the code, the scratch directory, the
rlimits, whether to isolate and to install the audit hook. It reads the request, points stdin at
/dev/null and enters the containment `srtcli.rollout.agent.sandbox_isolation` can give.

With a PID namespace it forks the namespace's init, which forks the process that runs the code;
when the code's process ends, the init exits and the kernel kills every process left in the
namespace (and the init dies with this process: PR_SET_PDEATHSIG). Then rlimits, no
capabilities, no_new_privs, the audit hook (a second layer: Python's sockets and its writes
outside scratch; ctypes bypasses it), and the code runs as `__main__`. What was achieved is
written as a JSON list to the report fd, which is closed before the code runs.
"""

import json
import linecache
import os
import resource
import signal
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_isolation as isolation  # noqa: E402  (a sibling file: this runs as a script)

del sys.path[0]

PR_SET_PDEATHSIG = 1
CODE_NAME = "<code>"
# rlimit name in the request -> resource; the hard CPU limit is a second later (SIGXCPU, then SIGKILL).
RLIMITS = {"cpu_time_s": resource.RLIMIT_CPU, "memory_bytes": resource.RLIMIT_AS,
           "max_file_bytes": resource.RLIMIT_FSIZE, "max_open_files": resource.RLIMIT_NOFILE,
           "max_processes": resource.RLIMIT_NPROC}
WRITE_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                "os.link": (0, 1), "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,), "os.utime": (0,), "shutil.rmtree": (0,)}


def supervise_namespace(report_fd: int) -> None:
    """Fork the PID namespace's init, which forks the process that returns to run the code (so the
    code has ordinary signal semantics, which an init has not); pass on how the code ended.

    The init exits when the code does, and with it every process left in the namespace: so this
    process ends only after all of them. SIGTERM here kills the init; it also dies with this
    process (PR_SET_PDEATHSIG), and a kill of the whole process group (which it never leaves)
    reaches it even before its prctl.
    """
    status_r, status_w = os.pipe()
    init_pid = os.fork()
    if init_pid == 0:
        isolation.LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        code_pid = os.fork()
        if code_pid == 0:
            os.close(status_r)
            os.close(status_w)
            return
        os.close(report_fd)
        status = os.waitpid(code_pid, 0)[1]
        os.write(status_w, status.to_bytes(4, "little"))
        os._exit(0)
    os.close(report_fd)
    os.close(status_w)
    # the caller's SIGTERM: end the namespace and return only once all of it is gone
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init_pid, signal.SIGKILL))
    os.wait()
    data = os.read(status_r, 4)
    pass_on(int.from_bytes(data, "little") if len(data) == 4 else signal.SIGKILL)


def pass_on(status: int) -> None:
    """End this process the way the code's process ended (exit code, or the same signal)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def apply_rlimits(limits: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, which in RLIMITS.items():
        value = limits.get(name)
        if value is not None:
            value = int(value)
            hard = value + 1 if which == resource.RLIMIT_CPU else value
            resource.setrlimit(which, (value, hard))


def inside(path: object, scratch: str) -> bool:
    if isinstance(path, int) or path is None:
        return True  # an already open descriptor, or no path at all
    real = os.path.realpath(os.fsdecode(os.fspath(path)))
    return real == scratch or real.startswith(scratch + os.sep) or real == os.devnull


def writes(mode: object, flags: object) -> bool:
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))


def install_audit_hook(scratch: str) -> None:
    """Refuse Python's sockets and its writes outside scratch (a second layer: ctypes bypasses it)."""
    scratch = os.path.realpath(scratch)

    def hook(event: str, args: tuple) -> None:
        if event.startswith("socket."):
            raise PermissionError(f"sandbox: no network ({event})")
        if event == "open" and writes(args[1], args[2]) and not inside(args[0], scratch):
            raise PermissionError(f"sandbox: cannot write outside the scratch directory: {args[0]}")
        if event in WRITE_EVENTS and not all(inside(args[i], scratch) for i in WRITE_EVENTS[event]):
            raise PermissionError(f"sandbox: cannot change files outside the scratch directory ({event})")

    sys.addaudithook(hook)


def run_code(code: str) -> None:
    """Run the code as `__main__`; a traceback as Python prints it, without this file's frames
    (the audit hook's among them)."""
    linecache.cache[CODE_NAME] = (len(code), None, code.splitlines(True), CODE_NAME)
    main_module = types.ModuleType("__main__")  # the code's own, so pickle finds what it defines
    sys.modules["__main__"], sys.argv = main_module, [CODE_NAME]
    try:
        compiled = compile(code, CODE_NAME, "exec")
        exec(compiled, main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as e:  # the code's own failure: show it the way Python would
        sys.stdout.flush()
        shown = traceback.TracebackException.from_exception(e)
        shown.stack = traceback.StackSummary.from_list([f for f in shown.stack if f.filename != __file__])
        sys.stderr.write("".join(shown.format()))
        sys.exit(1)


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    scratch, report_fd = request["scratch"], request["report_fd"]
    host_root = isolation.is_host_root()
    layers = isolation.isolate(scratch) if request["isolate"] else []
    if request["limits"].get("max_processes") is not None and ("unprivileged-uid" in layers or not host_root):
        layers.append("process-limit")
    if "pid-namespace" in layers:
        supervise_namespace(report_fd)
    apply_rlimits(request["limits"])
    isolation.drop_capabilities()
    os.chdir(scratch)
    sys.dont_write_bytecode = True
    if request["audit_hook"]:
        install_audit_hook(scratch)
        layers.append("audit-hook")
    os.write(report_fd, json.dumps(["rlimits", *layers]).encode())
    os.close(report_fd)
    run_code(request["code"])


if __name__ == "__main__":
    main()
