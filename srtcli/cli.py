"""The `srt` command: a click group whose subcommands live in their own modules.

    srt rollout  speculative rollout with the SRT drafter        (srtcli/rollout_cmd.py)
    srt pack     prefix-tree packing of a steps pool into shards   (srtcli/pack_cmd.py)
    srt train    policy-gradient training over packed shards       (srtcli/train_cmd.py)
    srt cache    stats | prune | export | import | add             (srtcli/cache_cmd.py)

Subcommands are registered lazily so that `srt cache stats` never imports torch.
"""

from __future__ import annotations

import importlib

import click

from srtcli import __version__

# command name -> "module:attribute"
COMMANDS = {
    "rollout": "srtcli.rollout_cmd:rollout",
    "pack": "srtcli.pack_cmd:pack",
    "train": "srtcli.train_cmd:train",
    "cache": "srtcli.cache_cmd:cache",
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            if e.name == module:  # the subcommand is not built yet
                return None
            raise


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="srt")
def cli() -> None:
    """srt: cheaper RL training of language models with token trees."""


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
