"""The learner loads the policy sharded from the first byte (`magic.learner.loading`): under ZeRO-3
each rank reads only its own partition of every parameter from the safetensors files; under
ZeRO-1/2 the replica is read in the training precision, never float32 first. Measured as each
rank's peak resident memory over the load, against the whole model's float32 bytes (a rank that
materialised the whole model, as `from_pretrained` then `.to(device)` did, would be at ≥ 100%).
Also: the loaded weights are the files' exactly, and weights that do not match config.json are
refused before anything is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from magic.learner import loading
from ranks import run_ranks

SCRIPT = Path(__file__).with_name("sharded_load_rank.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A 114M-parameter Qwen2-shaped model (456 MB in float32): big enough that a rank's share
    stands out of the process's own noise."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=2,
                      vocab_size=8000, tie_word_embeddings=False, max_position_embeddings=512)
    out = tmp_path_factory.mktemp("sharded-model")
    Qwen2ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    return out


def launch(model_dir: Path, out: Path, world: int, zero_stage: int, precision: str) -> list[dict]:
    run_ranks(SCRIPT, world, model_dir, out, zero_stage, precision)
    return [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(world)]


def _files(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.parametrize("world", [2, 4])
def test_zero3_ranks_read_only_their_share(model_dir, tmp_path, world):
    files = _files(model_dir)
    model_bytes = sum(t.numel() * 4 for t in files.values())
    ranks = launch(model_dir, tmp_path / "state.pt", world, 3, "fp32")
    print({r: (round(g["peak"] / model_bytes, 3), round(g["peak_anon"] / model_bytes, 3)) for r, g in enumerate(ranks)})
    for r, got in enumerate(ranks):
        share = model_bytes / world
        assert got["held"] == pytest.approx(share, rel=0.02), r  # its partition of every parameter, no more
        # the load's peak: its share, one module's parameters at construction (the 25 MB embedding) and the
        # allocator's slack; a rank holding the whole model would be at >= 100%
        assert got["peak"] < share + 0.3 * model_bytes, (r, got["peak"] / model_bytes)
        assert got["peak_anon"] < share + 0.3 * model_bytes, (r, got["peak_anon"] / model_bytes)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert set(state) == set(files)
    for k, v in files.items():
        assert torch.equal(state[k], v), k


def test_zero2_reads_the_replica_in_bf16(model_dir, tmp_path):
    files = _files(model_dir)
    model_bytes = sum(t.numel() * 4 for t in files.values())
    ranks = launch(model_dir, tmp_path / "state.pt", 2, 2, "bf16")
    for r, got in enumerate(ranks):
        assert got["dtypes"] == ["torch.bfloat16"]
        assert got["held"] == pytest.approx(model_bytes / 2, rel=0.01)
        assert got["peak"] < 0.7 * model_bytes, (r, got["peak"] / model_bytes)  # never the float32 model
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    for k, v in files.items():
        assert torch.equal(state[k], v.to(torch.bfloat16)), k


def test_weights_that_do_not_match_the_config_are_refused_by_name(model_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 2048
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp\.down_proj\.weight: shape \[768, 3072\], config\.json makes it \[768, 2048\]"):
        loading.check_files(bad)
    cfg["num_hidden_layers"] = 13
    cfg.pop("layer_types", None)  # transformers checks it against num_hidden_layers itself
    cfg["intermediate_size"] = 3072
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model\.layers\.12\..*missing from the weights files"):
        loading.check_files(bad)
    loading.check_files(model_dir)  # the intact model passes
