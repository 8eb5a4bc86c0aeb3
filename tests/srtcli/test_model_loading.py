"""`srtcli.models`: the default model directory and one-line errors for anything that is not a model."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from srtcli.errors import SrtError
from srtcli.models import check_model_dir, default_model_dir, load_model_and_tokenizer, load_tokenizer


def _copy_bundled(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(default_model_dir(), d)
    return d


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "model directory not found"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "not a directory"),
        (lambda p: p, "not a model directory (missing config.json, tokenizer.json, tokenizer_config.json)"),
    ],
)
def test_not_a_model_dir(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(SrtError) as e:
        load_model_and_tokenizer(path)
    assert message in e.value.message and str(path) in e.value.message and "\n" not in e.value.message


def test_missing_weights_bad_config_and_corrupt_weights(tmp_path):
    d = _copy_bundled(tmp_path)
    (d / "model.safetensors").rename(d / "gone")
    with pytest.raises(SrtError, match="no weights"):
        check_model_dir(d)
    (d / "gone").rename(d / "model.safetensors")
    config = (d / "config.json").read_text()
    (d / "config.json").write_text("{\n  \"vocab_size\": 3,\n")
    with pytest.raises(SrtError, match=r"config.json:3: not valid JSON"):
        check_model_dir(d)
    (d / "config.json").write_text(config)
    (d / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(SrtError, match="cannot load the model") as e:
        load_model_and_tokenizer(d)
    assert "\n" not in e.value.message


def test_tokenizer_without_eos_is_an_error(tmp_path):
    d = _copy_bundled(tmp_path)
    cfg = (d / "tokenizer_config.json").read_text().replace('"eos_token": "<|im_end|>"', '"eos_token": null')
    (d / "tokenizer_config.json").write_text(cfg)
    with pytest.raises(SrtError, match="no eos token"):
        load_tokenizer(d)


def test_default_loads_the_bundled_model():
    model, tok = load_model_and_tokenizer()
    assert not model.training and tok.eos_token == "<|im_end|>"


def test_error_reaches_the_user_as_one_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1?"}\n')
    out = subprocess.run([sys.executable, "-m", "srtcli", "rollout", "--prompts", str(prompts), "--model", str(tmp_path),
                          "--out", str(tmp_path / "pool")], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"Error: {tmp_path}: not a model directory (missing config.json, tokenizer.json, tokenizer_config.json)"]


def _without_model_type(d):
    config = json.loads((d / "config.json").read_text())
    del config["model_type"]
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize("tokenizer", [True, False])
def test_one_rule_for_every_command(tmp_path, tokenizer):
    """`rollout` (a tokenizer loaded) and `train` (`tokenizer=False`) check a directory the same
    way: a model config with a model_type, and weights under a name transformers loads."""
    no_type = _without_model_type(_copy_bundled(tmp_path / "a"))
    with pytest.raises(SrtError, match=r"config.json: not a model config \(no model_type\)"):
        check_model_dir(no_type, tokenizer=tokenizer)
    adapter = _copy_bundled(tmp_path / "b")
    (adapter / "model.safetensors").rename(adapter / "adapter_model.safetensors")
    with pytest.raises(SrtError, match=r"not a model directory \(no weights: expected model.safetensors\)"):
        check_model_dir(adapter, tokenizer=tokenizer)
    bare = _copy_bundled(tmp_path / "c")
    (bare / "tokenizer.json").unlink()
    if tokenizer:
        with pytest.raises(SrtError, match=r"not a model directory \(missing tokenizer.json\)"):
            check_model_dir(bare)
    else:
        assert check_model_dir(bare, tokenizer=False) == bare  # training needs no tokenizer


def test_a_sharded_pytorch_checkpoint_loads(tmp_path):
    """Weights as `pytorch_model-*.bin` shards with their index (the format of older HF
    checkpoints) load like model.safetensors."""
    from safetensors.torch import load_file

    d = _copy_bundled(tmp_path)
    weights = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(weights)
    files = {n: f"pytorch_model-0000{1 + i % 2}-of-00002.bin" for i, n in enumerate(names)}
    for f in set(files.values()):
        torch.save({n: weights[n] for n in names if files[n] == f}, d / f)
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": files}))
    model, tok = load_model_and_tokenizer(d)
    assert all(torch.equal(model.state_dict()[n], w) for n, w in weights.items()) and tok.eos_token == "<|im_end|>"
