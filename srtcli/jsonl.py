"""Lines of the JSONL files srt reads (prompts, steps pools, rollouts for `srt cache add`).

One reader for all of them, so every input is split the same way:

- lines end at `\\n` only. JSON strings may hold a raw U+2028, U+2029, U+0085 or form feed
  (writers with `ensure_ascii=False` produce them), which `str.splitlines()` would cut in two;
  a `\\r` before the `\\n` is JSON whitespace and harmless;
- a UTF-8 byte order mark at the start of the file is dropped (editors on Windows add it);
- bytes that are not UTF-8 are a one-line `SrtError` naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator

from srtcli.errors import at

BOM = b"\xef\xbb\xbf"


def split_lines(stream: BinaryIO, path: Path | str) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of each line of a binary stream, the newline kept."""
    for lineno, raw in enumerate(stream, start=1):
        if lineno == 1 and raw.startswith(BOM):
            raw = raw[len(BOM):]
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise at(path, lineno, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None


def read_lines(path: Path | str) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of each line of a UTF-8 JSONL file; see the module docstring."""
    with open(path, "rb") as f:
        yield from split_lines(f, path)
