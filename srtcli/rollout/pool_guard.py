"""One writer per steps pool, and the record of the run that writes it.

`srt rollout` holds a `PoolGuard` for its whole run, from before the model loads:

- the lock: an exclusive `flock` on `.NAME.lock` beside the pool file `NAME`. A second writer
  of the same pool is refused at once with one line. The kernel drops the lock when its process
  ends, however it ends, so a SIGKILLed writer never blocks the next run; the lock file is
  removed (while still locked) when the guard is released.
- the run record `NAME.run.json`: what defines the run (srtcli.run_record), written when the
  pool is started and compared on `--resume`; a mismatch is refused with one line. A pool
  written before records existed resumes with a one-line note that its options could not be
  checked.

A guard released while the pool file still holds no step leaves nothing behind: no lock file,
no record, and no directory it created.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError
from srtcli.rollout.config import RolloutConfig
from srtcli.run_record import mismatches

RECORD_FORMAT = "srt-rollout-run"
RECORD_VERSION = 1


def lock_path(pool_file: Path) -> Path:
    return pool_file.parent / f".{pool_file.name}.lock"


def record_path(pool_file: Path) -> Path:
    return pool_file.parent / f"{pool_file.name}.run.json"


def has_steps(pool_file: Path) -> bool:
    return pool_file.is_file() and pool_file.stat().st_size > 0


def _make_parents(d: Path) -> list[Path]:
    """mkdir -p; returns the directories it created, deepest first."""
    made = []
    while not d.exists():
        made.append(d)
        d = d.parent
    for m in reversed(made):
        try:
            m.mkdir(exist_ok=True)
        except OSError as e:
            raise SrtError(f"{m}: cannot create the pool's directory ({e.strerror})") from None
    return made


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _acquire(pool_file: Path) -> int:
    """An fd holding the exclusive lock of `pool_file`; refuses at once if another has it."""
    path = lock_path(pool_file)
    for _ in range(100):  # retried only when a releasing writer removes the file under us
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            _make_parents(path.parent)
            continue
        except OSError as e:
            raise SrtError(f"{path}: cannot create the pool's lock file ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fd)
            os.close(fd)
            raise SrtError(f"{pool_file}: another srt rollout is writing this pool{who}; "
                           "wait for it to finish (then --resume continues it)") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # we locked a file its last holder had just removed: try the new one
    raise SrtError(f"{path}: cannot take the pool's lock")


def read_record(pool_file: Path) -> dict[str, Any] | None:
    """The recorded options of a pool, or None when it has no record."""
    path = record_path(pool_file)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SrtError(f"{path}: unreadable run record ({e}); remove it to resume unchecked") from None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT or not isinstance(data.get("options"), dict):
        raise SrtError(f"{path}: not an srt run record; remove it to resume unchecked")
    if data.get("version") != RECORD_VERSION:
        raise SrtError(f"{path}: run record version {data.get('version')}, this srt reads {RECORD_VERSION}")
    return data["options"]


def write_record(pool_file: Path, options: dict[str, Any]) -> None:
    path = record_path(pool_file)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    body = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "options": options}
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class PoolGuard:
    """The lock and run record of one pool for the length of a `with` block (see the module)."""

    def __init__(self, pool_file: Path, options: dict[str, Any], resume: bool):
        self.pool_file = Path(pool_file)
        self.options = options
        self.resume = resume
        self.note: str | None = None  # set when a resumed pool had no record to check
        self._fd: int | None = None
        self._made: list[Path] = []

    def __enter__(self) -> "PoolGuard":
        self._made = _make_parents(self.pool_file.parent)
        self._fd = _acquire(self.pool_file)
        try:
            self._start()
        except BaseException:
            self._release()
            raise
        return self

    def _start(self) -> None:
        if not has_steps(self.pool_file):
            write_record(self.pool_file, self.options)  # a new pool: this run defines it
            return
        if not self.resume:
            raise SrtError(f"{self.pool_file}: already exists (use --resume to continue it)")
        recorded = read_record(self.pool_file)
        if recorded is None:
            self.note = (f"note: {self.pool_file} has no run record (written by an older srt): "
                         "the resumed run's options could not be checked")
            return
        diff = mismatches(recorded, self.options)
        if diff:
            raise SrtError(f"{self.pool_file}: cannot resume a changed run: {'; '.join(diff)}")

    def __exit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._fd is None:
            return
        if not has_steps(self.pool_file):
            record_path(self.pool_file).unlink(missing_ok=True)
        lock_path(self.pool_file).unlink(missing_ok=True)  # still locked: see _acquire
        os.close(self._fd)
        self._fd = None
        for d in self._made:
            try:
                d.rmdir()  # only if we made it and it is empty
            except OSError:
                break


# What decides the samples a pool holds; a resumed run must not change them. Speed-only
# options (--draft, --budget, --batch-size, --cache, --device, --engine, ...) may change.
RUN_OPTIONS = ("-n", "--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--tools", "--reward",
               "--max-turns", "--max-tool-tokens", "--max-context")


def run_definition(config: RolloutConfig) -> dict[str, Any]:
    """The run record of a rollout (srtcli.run_record): models and prompts by content."""
    from srtcli.models import default_model_dir
    from srtcli.run_record import file_entry

    c = config
    values = {"-n": c.k, "--max-new-tokens": c.max_new_tokens, "--temperature": c.temperature,
              "--top-p": c.top_p, "--top-k": c.top_k, "--seed": c.seed, "--tools": c.tool, "--reward": c.reward_spec,
              "--max-turns": c.max_turns, "--max-tool-tokens": c.max_tool_tokens, "--max-context": c.max_context}
    model = Path(c.model) if c.model else default_model_dir()
    return {"--model": file_entry(model), "--prompts": file_entry(Path(c.prompts_path)),
            **{k: values[k] for k in RUN_OPTIONS}}


def guard_for(config: RolloutConfig) -> PoolGuard:
    """The pool's lock and run record for this run."""
    return PoolGuard(config.pool_file, run_definition(config), bool(config.resume))
