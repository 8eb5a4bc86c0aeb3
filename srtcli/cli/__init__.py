"""The `srt` command: a click group whose subcommands live in their own modules.

    srt rollout  speculative rollout with the SRT drafter        (srtcli.cli.rollout)
    srt pack     prefix-tree packing of a steps pool into shards   (srtcli.cli.pack)
    srt train    policy-gradient training over packed shards       (srtcli.cli.train)
    srt cache    stats | prune | export | import | add             (srtcli.cli.cache)

Subcommands are registered lazily so that `srt cache stats` never imports torch, and `srt
--help` lists them without importing any: each one-line help is the first line of its
command's docstring, read from the module's source (`summary`).

The group also owns how a run ends: srt's own errors (`srtcli.errors`, raised by library code)
and usage errors (a bad flag value, from the command line or a `--config` file, an unknown flag,
a missing option) are one `Error: ...` line with exit status 1; an interruption (Ctrl-C) is one
line with exit status 130; srt's own warnings are one `srt: warning: ...` line.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import click

from srtcli import __version__
from srtcli.cli.config import config_source
from srtcli.errors import Interrupted, SrtError

# command name -> the "module:function" that implements it
COMMANDS = {
    "rollout": "srtcli.cli.rollout:rollout",
    "pack": "srtcli.cli.pack:pack",
    "train": "srtcli.cli.train:train",
    "cache": "srtcli.cli.cache:cache",
}


def summary(target: str) -> str:
    """The first line of the docstring of `target` ("module:function"), read from the module's
    source without importing it (a command's module may import torch)."""
    module, attr = target.split(":")
    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == attr)
    return (ast.get_docstring(fn) or "").strip().splitlines()[0]


def usage_line(e: click.UsageError, fallback: str = "srt") -> str:
    """A click usage error as one line: `srt rollout: -n/--n: 0 is not in the range x>=1`, or
    `run.yaml:3: temperature: -1.0 is not ...` when the bad value came from a --config file.
    `fallback` names the command when click did not attach its context to the error."""
    ctx = e.ctx
    param = getattr(e, "param", None)
    if isinstance(e, click.BadParameter) and not isinstance(e, click.MissingParameter) \
            and param is not None and ctx is not None:
        what = _one_line(e.message)
        source = config_source(ctx, param.name)
        if source is not None:
            return f"{source}: {what}"
        hint = "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name
        return f"{ctx.command_path}: {hint}: {what}"
    where = ctx.command_path if ctx is not None else fallback
    return f"{where}: {_one_line(e.format_message())}"


def _one_line(message: str) -> str:
    """One line, no trailing period, lower case first letter: it follows `where: `."""
    text = " ".join(message.split()).rstrip(".").replace(". (", " (").replace(". Did you", "; did you")
    text = text.replace("(Did you", "(did you")
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def command_words(prog: str, argv: list[str]) -> str:
    """`srt rollout` / `srt cache add` from the command line, for messages without a context."""
    words = [prog]
    if argv and argv[0] in COMMANDS:
        words.append(argv[0])
        if argv[0] == "cache" and len(argv) > 1 and not argv[1].startswith("-"):
            words.append(argv[1])
    return " ".join(words)


def _is_srts(category: type) -> bool:
    return category.__module__.split(".")[0] in ("cache_store", "attention", "srtcli")


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """srt's own warnings (cache_store, attention, srtcli) as one `srt: warning: ...` line;
    anyone else's as Python prints them."""
    saved = warnings.showwarning

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if _is_srts(category):
            click.echo(f"srt: warning: {message}", err=True)
        else:
            saved(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            if e.name == module:  # the subcommand is not built yet
                return None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list: `srt --help` imports no subcommand (and so no torch)."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary(COMMANDS[name])) for name in sorted(COMMANDS)])

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """click's main, with srt's endings: usage errors exit 1 in one line, Ctrl-C exits 130."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        where = command_words(prog_name or "srt", argv)
        with _one_line_warnings():
            try:
                rv = super().main(argv, prog_name, complete_var, False, **extra)
            except click.exceptions.NoArgsIsHelpError as e:  # `srt` or `srt cache` alone: the help
                e.show()
                sys.exit(1)
            except click.UsageError as e:
                click.echo(f"Error: {usage_line(e, where)}", err=True)
                sys.exit(1)
            except SrtError as e:
                click.echo(f"Error: {e.message}", err=True)
                sys.exit(e.exit_code)
            except Interrupted as e:  # not an `Error:`: the user stopped it
                click.echo(e.message, err=True)
                sys.exit(e.exit_code)
            except click.ClickException as e:
                e.show()
                sys.exit(e.exit_code)
            except click.Abort as e:
                if not isinstance(e.__context__, KeyboardInterrupt):
                    click.echo("Error: aborted", err=True)
                    sys.exit(1)
                click.echo(f"{where}: interrupted", err=True)
                sys.exit(Interrupted.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="srt")
def cli() -> None:
    """srt: cheaper RL training of language models with token trees."""


def main() -> None:
    cli(prog_name="srt")  # also under `python -m srtcli` and torchrun: messages name `srt ...`


if __name__ == "__main__":
    main()
