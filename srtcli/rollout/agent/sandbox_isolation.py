"""How the sandbox's child contains itself: the strongest mechanism this machine allows.

Loaded by `srtcli.rollout.agent.sandbox_child` (a script, so this is imported by file, not as part
of the package); standard library only. `isolate(scratch)` tries, strongest first:

- as root with CAP_SYS_ADMIN: new mount, network and PID namespaces; every mount read-only and
  nosuid except a bind of the scratch directory and a private 64 MB tmpfs on /dev/shm (directories others cannot enter on the way to
  the interpreter, such as a 0700 /root holding pyenv, are covered by a tmpfs holding binds of
  just what the interpreter needs); then uid/gid `nobody`; then a user namespace of its own (so
  RLIMIT_NPROC counts this call's processes, not every `nobody` on the machine);
- otherwise (root without CAP_SYS_ADMIN first drops to `nobody` where `nobody` can read the
  interpreter): a user namespace with new mount, network and PID namespaces, the same mounts;
- where namespaces are refused: nothing (the caller's rlimits and audit hook remain).

It returns the layers it achieved, by name. `drop_capabilities` then leaves the code no
capability in any namespace it owns, so it cannot undo the mounts.
"""

import ctypes
import os
import pwd
import stat
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_REC, MS_PRIVATE, MS_BIND, MS_NOSUID, MS_NODEV = 0x4000, 0x40000, 0x1000, 0x2, 0x4
SHM_OPTIONS = b"size=64m,mode=1777"
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_RECURSIVE, AT_FDCWD = 0x1, 0x2, 0x8000, -100
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the table unification)
PR_SET_NO_NEW_PRIVS = 38

LIBC = ctypes.CDLL(None, use_errno=True)


def unshare(flags: int) -> bool:
    """unshare(2); a new user namespace maps this uid and gid to themselves (files need an owner)."""
    uid, gid = os.geteuid(), os.getegid()
    if LIBC.unshare(flags) != 0:
        return False
    if flags & CLONE_NEWUSER:
        for name, line in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
            try:
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(line)
            except OSError:
                pass  # unmapped ids still run code; only creating files on a new tmpfs needs them
    return True


def mount_attr(path: str, flags: int, attr_set: int, attr_clr: int) -> bool:
    """mount_setattr(2): change mount flags of `path` (and, with AT_RECURSIVE, every mount below)."""
    attr = (ctypes.c_uint64 * 4)(attr_set, attr_clr, 0, 0)
    return LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, attr, 32) == 0


def read_only_except(scratch: str) -> bool:
    """Every mount read-only and nosuid, in this mount namespace only; scratch stays writable."""
    try:
        return read_only_mounts(scratch)
    except OSError:
        return False


def read_only_mounts(scratch: str) -> bool:
    if LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False  # without private propagation the changes could reach the host's mounts
    if not expose_interpreter(scratch):
        return False
    if not mount_attr("/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0):
        return False
    if LIBC.mount(scratch.encode(), scratch.encode(), None, MS_BIND, None) != 0:
        return False
    if os.path.isdir("/dev/shm"):  # POSIX semaphores (multiprocessing): a private, small one
        LIBC.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, SHM_OPTIONS)
    return mount_attr(scratch, 0, 0, MOUNT_ATTR_RDONLY)


def hidden_entries(scratch: str) -> dict[str, set[str]]:
    """Directories on the way to the interpreter or scratch that others cannot enter (e.g. a 0700
    /root holding pyenv) -> the entries below them on that way."""
    out: dict[str, set[str]] = {}
    needed = [os.path.dirname(os.path.realpath(sys.executable)), scratch]
    needed += [os.path.realpath(p) for p in sys.path if os.path.isdir(p)]
    for path in needed:
        parts = path.strip("/").split("/")
        for i in range(len(parts) - 1):
            above = "/" + "/".join(parts[:i])
            if not os.stat(above).st_mode & stat.S_IXOTH:
                out.setdefault(above, set()).add(parts[i])
                break
    return out


def expose_interpreter(scratch: str) -> bool:
    """Cover each such directory, in this mount namespace only, with an empty tmpfs holding binds
    of just those entries, so that `nobody` can import the standard library and nothing else there."""
    for _ in range(8):  # a hidden directory may hold another one
        hidden = hidden_entries(scratch)
        if not hidden:
            return True
        above = min(hidden, key=len)
        fds = {name: os.open(os.path.join(above, name), os.O_PATH) for name in hidden[above]}
        if LIBC.mount(b"tmpfs", above.encode(), b"tmpfs", 0, b"mode=0755") != 0:
            return False
        for name, fd in fds.items():
            target = os.path.join(above, name)
            os.mkdir(target) if stat.S_ISDIR(os.fstat(fd).st_mode) else open(target, "x").close()
            if LIBC.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None):
                return False
            os.close(fd)
    return False


def drop_to_nobody(scratch: str) -> bool:
    try:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    except KeyError:
        uid = gid = 65534
    try:
        os.chown(scratch, uid, gid)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError:
        return False
    return True


def is_host_root() -> bool:
    """Whether this uid is root outside its user namespace too: root ignores RLIMIT_NPROC."""
    uid = os.geteuid()
    try:
        with open("/proc/self/uid_map") as f:
            for inner, outer, count in (map(int, line.split()) for line in f):
                if inner <= uid < inner + count:
                    return outer + uid - inner == 0
    except OSError:
        pass
    return uid == 0


def isolate(scratch: str) -> list[str]:
    """Enter the strongest containment available; the layers achieved, by name."""
    layers = []
    if os.geteuid() == 0 and unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID):
        layers += ["network-namespace", "pid-namespace"]
        if read_only_except(scratch):
            layers.append("read-only-fs")
        if not hidden_entries(scratch) and drop_to_nobody(scratch):  # `nobody` can read the interpreter
            layers.append("unprivileged-uid")
            if unshare(CLONE_NEWUSER):
                layers.append("user-namespace")
        return layers
    # without a mount namespace, `nobody` may be unable to read the standard library: stay root then
    if os.geteuid() == 0 and not hidden_entries(scratch) and drop_to_nobody(scratch):
        layers.append("unprivileged-uid")
    if unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID):
        layers += ["user-namespace", "network-namespace", "pid-namespace"]
        if read_only_except(scratch):
            layers.append("read-only-fs")
    return layers


def drop_capabilities() -> None:
    """No capabilities left in any namespace this process owns; exec cannot gain any."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    LIBC.capset(header, (ctypes.c_uint32 * 6)())
    LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
