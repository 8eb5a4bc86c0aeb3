"""`--config file.yaml` for every command: keys are the long flag names, flags win.

The option is eager, so it runs before the others; it loads the YAML mapping into the
click context's `default_map`, which click consults only for parameters the user did
not give on the command line. That is exactly "flags win over the file". It also records
where each value came from, so a bad one is reported as `file:line: key: reason`
(`config_source`, used by srtcli.cli).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click
import yaml

from srtcli.errors import SrtError

_SOURCES = "srt.config_sources"  # ctx.meta key: parameter name -> "file:line: key"


def config_source(ctx: click.Context, name: str | None) -> str | None:
    """`file:line: key` if parameter `name` took its value from the --config file, else None."""
    from click.core import ParameterSource

    if name is None or ctx.get_parameter_source(name) is not ParameterSource.DEFAULT_MAP:
        return None
    return ctx.meta.get(_SOURCES, {}).get(name)


def _key_lines(text: str) -> dict[Any, int]:
    """Line number (1-based) of each top-level key of a YAML mapping, as the loader reads keys."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if not isinstance(node, yaml.MappingNode):
            return {}
        return {loader.construct_object(k, deep=True): k.start_mark.line + 1 for k, _ in node.value}
    except (yaml.YAMLError, TypeError):  # an unhashable key: the mapping check reports it
        return {}
    finally:
        loader.dispose()


def _read(path: Path) -> tuple[str, dict]:
    """The file's text and its mapping; a one-line SrtError for anything else."""
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise SrtError(f"{path}: config file not found") from None
    except UnicodeDecodeError:
        raise SrtError(f"{path}: config file is not UTF-8 text") from None
    except OSError as e:
        raise SrtError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise SrtError(f"{path}{line}: not valid YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SrtError(f"{path}: a config file must be a mapping of long flag names to values")
    return text, data


def _flags(command: click.Command) -> dict[str, tuple[str, bool | None]]:
    """Every key a config file may use -> (parameter name, False for a `--no-x` flag else None).

    A key may be any long flag of an option (`max-tokens`, `--max-tokens`, `no-run-ahead` for
    a boolean pair) or its parameter name; it sets that option's parameter."""
    by_flag: dict[str, tuple[str, bool | None]] = {}
    for p in command.params:
        if not isinstance(p, click.Option) or p.name == "config":
            continue
        by_flag[p.name] = (p.name, None)
        for flag in p.opts:
            if flag.startswith("--"):
                by_flag[flag[2:]] = (p.name, None)
        for flag in p.secondary_opts:  # `--no-x` of a `--x/--no-x` pair means False
            if flag.startswith("--"):
                by_flag[flag[2:]] = (p.name, False)
    return by_flag


def _load(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if not value:
        return
    path = Path(value)
    text, data = _read(path)
    by_flag, lines = _flags(ctx.command), _key_lines(text)
    defaults: dict[str, Any] = {}
    sources = ctx.meta.setdefault(_SOURCES, {})
    for key, val in data.items():
        line = lines.get(key)
        where = f"{path}:{line}" if line is not None else f"{path}"
        if isinstance(key, bool):  # YAML 1.1 reads a bare `yes:`/`no:` key as a boolean
            key = "yes" if key else "no"
        flag = str(key).lstrip("-")
        hit = by_flag.get(flag) or by_flag.get(flag.replace("-", "_"))
        if hit is None:
            raise SrtError(f"{where}: unknown key {key!r} for `{ctx.command_path}`")
        name, negated = hit
        defaults[name] = (not val) if negated is False and isinstance(val, bool) else val
        sources[name] = f"{where}: {key}"
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
