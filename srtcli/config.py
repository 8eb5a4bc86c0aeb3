"""`--config file.yaml` for every command: keys are the long flag names, flags win.

The option is eager, so it runs before the others; it loads the YAML mapping into the
click context's `default_map`, which click consults only for parameters the user did
not give on the command line. That is exactly "flags win over the file".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click
import yaml

from srtcli.errors import SrtError


def _load(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if not value:
        return
    path = Path(value)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SrtError(f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise SrtError(f"{path}{line}: not valid YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SrtError(f"{path}: a config file must be a mapping of long flag names to values")
    # A key may be any long flag of an option (`max-tokens`, `--max-tokens`, `no-run-ahead`
    # for a boolean pair) or its parameter name; it sets that option's parameter.
    by_flag: dict[str, tuple[str, Any]] = {}
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name == "config":
            continue
        by_flag[p.name] = (p.name, None)
        for flag in p.opts:
            if flag.startswith("--"):
                by_flag[flag[2:]] = (p.name, None)
        for flag in p.secondary_opts:  # `--no-x` of a `--x/--no-x` pair means False
            if flag.startswith("--"):
                by_flag[flag[2:]] = (p.name, False)
    defaults: dict[str, Any] = {}
    for key, val in data.items():
        if isinstance(key, bool):  # YAML 1.1 reads a bare `yes:`/`no:` key as a boolean
            key = "yes" if key else "no"
        flag = str(key).lstrip("-")
        hit = by_flag.get(flag) or by_flag.get(flag.replace("-", "_"))
        if hit is None:
            raise SrtError(f"{path}: unknown key {key!r} for `{ctx.command_path}`")
        name, negated = hit
        defaults[name] = (not val) if negated is False and isinstance(val, bool) else val
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def config_option(f: Callable) -> Callable:
    """Add `--config FILE` (YAML; keys are long flag names; flags given on the command line win)."""
    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        is_eager=True,
        expose_value=False,
        callback=_load,
        help="YAML file whose keys are long flag names; flags on the command line win.",
    )(f)
