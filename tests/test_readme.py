"""The README's quick start, run as written: every figure it shows that a rerun reproduces (token
counts, forwards, acceptance, rewards, the packing counts, the training line, cache stats) is
what its commands print, so the README cannot drift from srt.

The commands are read from the README itself (its `$ ` lines from "Quick start" up to "vLLM")
and run in order in a fresh directory; each output line the README shows must be among the
command's output lines, number for number. Wall-clock figures (`wall_s`, `tokens_per_s`,
`model_s`, `cpu_s`, `... s`, `... tok/s`) are illustrative and not compared; the first step's
loss and gradient norm are compared to 1e-3 (float reductions); `...` stands for lines left out.
The RL loop (`examples/rl_loop.sh`, minutes) is not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NOT_RUN = ("examples/rl_loop.sh",)
WALL_KEYS = {"wall_s", "tokens_per_s", "model_s", "cpu_s"}
FLOAT_NOISE = {"loss", "grad"}  # printed to 4-5 digits; summation order may move the last one
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def quick_start_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """The indented code blocks from "Quick start" to "vLLM": [(command, expected lines)]."""
    section = text[text.index("## Quick start"): text.index("## vLLM")]
    blocks, current = [], None
    for line in section.splitlines():
        if not line.startswith("    "):
            current = None
            continue
        if current is None:
            current = []
            blocks.append(current)
        body = line[4:]
        if body.startswith("$ "):
            current.append((body[2:], []))
        elif current:
            current[-1][1].append(body)
    return [b for b in blocks if b]


def template(line: str) -> str:
    return NUMBER.sub("#", " ".join(line.split()))


def compared_numbers(line: str) -> list[tuple[str, str]]:
    """(number, what it is) for each number: 'wall' (not compared), 'noisy' (1e-3) or 'exact'."""
    line = " ".join(line.split())
    out = []
    for m in NUMBER.finditer(line):
        key = re.findall(r"([A-Za-z_]+)\W*$", line[: m.start()])
        after = line[m.end():]
        if (key and key[0] in WALL_KEYS) or re.match(r"s\b|s$| tok/s", after):
            out.append((m.group(), "wall"))
        elif key and key[0] in FLOAT_NOISE:
            out.append((m.group(), "noisy"))
        else:
            out.append((m.group(), "exact"))
    return out


def same_figures(expected: str, actual: str) -> bool:
    for (e, kind), (a, _) in zip(compared_numbers(expected), compared_numbers(actual)):
        if kind == "exact" and e != a:
            return False
        if kind == "noisy" and abs(float(e) - float(a)) > 1e-3 * max(abs(float(e)), 1e-12):
            return False
    return True


def json_fragments(lines: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """README lines that show a `--json` object (`{"k": v, ...}` over one or more lines, `...`
    for keys left out) as {key: value text}; and the other lines."""
    objects, rest, buf = [], [], None
    for line in lines:
        if buf is None and line.lstrip().startswith("{"):
            buf = []
        if buf is None:
            rest.append(line)
            continue
        buf.append(line)
        if line.rstrip().endswith("}"):
            joined = " ".join(buf)
            objects.append(dict(re.findall(r'"(\w+)": (null|true|false|"[^"]*"|-?[\d.]+(?:e-?\d+)?)', joined)))
            buf = None
    return objects, rest


def check_command(cmd: str, expected: list[str], stdout: str, stderr: str) -> list[str]:
    """What in the README's output of `cmd` the real output contradicts (empty: all true)."""
    problems = []
    objects, lines = json_fragments(expected)
    if objects:
        real = json.loads(stdout.strip().splitlines()[-1])
        for obj in objects:
            for key, text in obj.items():
                if key not in WALL_KEYS and real.get(key, "<missing>") != json.loads(text):
                    problems.append(f"{cmd}: README shows {key}={text}, the command printed {real.get(key)}")
    actual = stdout.splitlines() + stderr.splitlines()
    for line in lines:
        if line.strip() == "...":
            continue
        shaped = [a for a in actual if template(a) == template(line)]
        if not shaped:
            problems.append(f"{cmd}: README line not in the output: {line!r}")
        elif not any(same_figures(line, a) for a in shaped):
            problems.append(f"{cmd}: README line {line!r}, the command printed {shaped[0].strip()!r}")
    return problems


def test_the_readme_parser_sees_the_quick_start():
    blocks = quick_start_blocks(README.read_text())
    commands = [c for b in blocks for c, _ in b]
    assert commands[0] == "head -16 examples/arith/prompts.jsonl > prompts16.jsonl"
    assert sum(c.startswith("srt rollout") for c in commands) == 3
    assert any(c.startswith("srt pack") for c in commands) and any(c.startswith("srt train") for c in commands)
    assert any(c.startswith("srt cache stats") for c in commands)
    assert compared_numbers("│ wall_s │ 0.957 │") == [("0.957", "wall")]
    assert compared_numbers("trained 1 steps in 5.5s; model in ckpt") == [("1", "exact"), ("5.5", "wall")]
    assert check_command("x", ["a 1 b 2"], "a 1 b 3\n", "") != []
    assert check_command("x", ['{"n": 2, "wall_s": 1.0, ...}'], '{"n": 2, "wall_s": 9.0}\n', "") == []


@pytest.mark.slow
def test_every_figure_of_the_quick_start_is_what_its_commands_print(tmp_path):
    text = README.read_text()
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "120", "SRT_CACHE": str(tmp_path / "default-cache")}
    problems = []
    for block in quick_start_blocks(text):
        for cmd, expected in block:
            if cmd.startswith(NOT_RUN):
                continue
            r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, f"{cmd}\n{r.stderr}"
            problems += check_command(cmd, expected, r.stdout, r.stderr)
    fall = re.search(r"forwards fall from (\d+) to (\d+)", text)
    tables = [b for b in quick_start_blocks(text)[0] if b[0].startswith("srt rollout")]
    shown = re.search(r"│ target_forwards\s*│\s*(\d+)", "\n".join(tables[0][1]))
    second = re.search(r'"target_forwards": (\d+)', text)
    assert fall and shown and second
    assert (fall.group(1), fall.group(2)) == (shown.group(1), second.group(1)), "the prose and the figures differ"
    assert not problems, "\n".join(problems)
