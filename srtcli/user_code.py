"""Loading the user's own code named on the command line (`MODULE:NAME` or `FILE.py:NAME`):
rewards (`--reward`) and tools (`--tools`) are found the same way and fail in one line."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from srtcli.errors import SrtError


def one_line(e: Exception) -> str:
    """An exception's message on one line (errors are one line, whatever the user code raised)."""
    return " ".join(str(e).split())


def split_target(spec: str, flag: str, builtins: list[str], form: str = "MODULE:NAME") -> tuple[str, str]:
    """`MODULE:NAME` -> (MODULE, NAME), or a one-line error saying what `flag` accepts."""
    if spec.count(":") != 1 or not all(spec.split(":")):
        # A Windows-style path is not supported; say what is.
        raise SrtError(f"{flag} {spec!r}: expected a built-in ({', '.join(sorted(builtins))}) or {form}")
    module, name = spec.split(":")
    return module, name


def load_target(spec: str, flag: str, builtins: list[str], what: str, form: str = "MODULE:NAME") -> Any:
    """The object `MODULE:NAME` names; `what` ("reward", "tools") words the errors."""
    module, name = split_target(spec, flag, builtins, form)
    obj = getattr(import_module(module, what), name, None)
    if obj is None:
        raise SrtError(f"{what} {spec}: {module} has no attribute {name!r}")
    return obj


def import_module(module: str, what: str) -> Any:
    """A module by dotted name (the working directory on the path) or by `.py` file."""
    if module.endswith(".py"):
        path = Path(module)
        if not path.is_file():
            raise SrtError(f"{path}: {what} file not found")
        spec = importlib.util.spec_from_file_location(f"_srt_{what}_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            raise SrtError(f"{path}: importing the {what} file failed: {type(e).__name__}: {one_line(e)}") from None
        return mod
    # The `srt` console script does not put the working directory on sys.path; users expect
    # `--reward myrewards:fn` to find ./myrewards.py as `python -m` would.
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise SrtError(f"{what} module {module!r} not found ({e.name} is not importable)") from None
    except Exception as e:
        raise SrtError(f"importing {what} module {module!r} failed: {type(e).__name__}: {one_line(e)}") from None
