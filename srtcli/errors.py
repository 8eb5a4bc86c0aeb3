"""Domain errors: what library code raises when the user can fix the cause.

`SrtError` is an error the user can fix (a bad file, a bad flag value, a foreign cache); its
message is one line, and one that concerns a file names it and, where there is one, the line:
`data.jsonl:17: ...` (`at`). `Interrupted` is a command stopped by Ctrl-C: one line saying what
was kept and how to go on. Nothing here knows about the command line: `srtcli.cli` turns them
into what users see (`Error: <message>` with exit status 1; the interruption line with 130,
what a shell reports for SIGINT).
"""

from __future__ import annotations


class SrtError(Exception):
    """An error the user can fix; printed as one line, exit status 1."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def at(path: object, line: int | None, message: str) -> SrtError:
    """An error located in a file (and line): `path:line: message`."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return SrtError(f"{where}: {message}")


class Interrupted(Exception):
    """Ctrl-C: `srt rollout: interrupted; rerun with --resume ...` (one line, exit status 130)."""

    exit_code = 130

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def first_line(e: BaseException) -> str:
    """An exception's message as one line: its first non-empty line ("" if it has none)."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), "")
