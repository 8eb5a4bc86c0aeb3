"""User errors: one line, a non-zero exit, no traceback.

Anything the user can cause (bad files, bad flags, a foreign cache) raises `SrtError`;
click prints it as `Error: <message>` and exits with status 1. Messages that concern a
file name the file and, where there is one, the line: `data.jsonl:17: ...`.
A command stopped by Ctrl-C raises `Interrupted`: one line saying what was kept and how to
go on, exit status 130 (what a shell reports for SIGINT).
"""

from __future__ import annotations

import click


class SrtError(click.ClickException):
    """An error the user can fix; printed as one line, exit status 1."""

    exit_code = 1


def at(path: object, line: int | None, message: str) -> SrtError:
    """An error located in a file (and line): `path:line: message`."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return SrtError(f"{where}: {message}")


class Interrupted(click.ClickException):
    """Ctrl-C: `srt rollout: interrupted; rerun with --resume ...` (one line, exit status 130)."""

    exit_code = 130

    def show(self, file: object = None) -> None:
        click.echo(self.message, err=True)  # not an `Error:`: the user stopped it
