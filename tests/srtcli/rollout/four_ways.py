"""`srt rollout` run four ways on a small prompts file (a test helper): with the defaults, with a
flag, with the same option as a `--config` key, and with both (where the flag must win)."""

from __future__ import annotations

from pathlib import Path


def rollout_four_ways(tmp_path: Path, flag: list[str], key: str, both: list[str], prompts: int = 1,
                      extra: tuple[str, ...] = ()) -> None:
    """Each run writes its own pool under `tmp_path` and must exit 0; `key` is the config file's
    text, `both` the flag given beside that file."""
    from click.testing import CliRunner

    from srtcli.cli import cli

    sums = "\n".join(f'{{"prompt": "{i}+{i}?"}}' for i in range(1, prompts + 1))
    (tmp_path / "p.jsonl").write_text(sums + "\n")
    (tmp_path / "c.yaml").write_text(key)
    config = ["--config", str(tmp_path / "c.yaml")]
    for name, args in (("default", []), ("flag", flag), ("config", config), ("both", config + both)):
        r = CliRunner().invoke(cli, ["rollout", "--prompts", str(tmp_path / "p.jsonl"), "-n", "2", "--max-new-tokens",
                                     "4", "--out", str(tmp_path / name), "--json", *extra, *args])
        assert r.exit_code == 0, r.output
