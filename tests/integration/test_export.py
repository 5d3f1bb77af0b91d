"""`magic export` of a checkpoint written by a real learner step on the tiny model: transformers
loads the export as is (same logits as the checkpoint, same tokenizer and chat template), a real
vLLM CPU server serves it as is (same greedy tokens as transformers), and bad input exits 2
naming the available steps. The vLLM test is skipped without `.venv-vllm` (a failure in CI)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from learner_batches import scored_groups, stage
from safetensors import safe_open
from vllm_venv import VLLM_PYTHON, require_vllm

from magic import modeling
from magic.cli import main
from magic.config.schema import OptimConfig
from magic.learner.backends import TorchBackend
from magic.learner.checkpoints import COMPLETE
from magic.learner.export import checkpoint_root
from magic.learner.trainer import Trainer
from magic.runtime.exits import Exit

pytestmark = pytest.mark.integration

OPTIM = OptimConfig(max_grad_norm=1.0)
MESSAGES = [{"role": "user", "content": "Add 3+5+2"}]
RUN = "r1"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """DATA_DIR with run r1's checkpoints of steps 2 and 3, each after a real learner step, on the
    smallest Qwen2 vLLM's CPU backend runs (head_dim 32) with the demo tokenizer."""
    from transformers.utils import logging as hf_logging

    from magic.demo.prepare import build_model

    hf_logging.disable_progress_bar()
    model_dir = tmp_path_factory.mktemp("export-model")
    build_model(model_dir, seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    vocab = modeling.load_model_config(model_dir).vocab_size
    policy = modeling.load_model(model_dir)
    trainer = Trainer(TorchBackend(policy, OPTIM, torch.device("cpu")), OPTIM, pad_id=0, micro_batch_tokens=256, assets_from=str(model_dir))
    data = tmp_path_factory.mktemp("data")
    root = checkpoint_root(data, RUN)
    for version in (2, 3):  # the policies after steps 1 and 2: versions 2 and 3
        trainer.train_step(scored_groups(version - 1, 4, 4, vocab, seed=version), version=version - 1, stage=stage(beta=0.0))
        trainer.save_checkpoint(root, version, keep=5)
        trainer.wait_for_checkpoint()
    return data


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_the_export_loads_in_transformers_as_is_with_the_checkpoints_logits(data_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "hf"
    assert main(["export", RUN, "--step", "3", "--out", str(out), "--data-dir", str(data_dir)]) == 0
    assert "exported" in capsys.readouterr().out
    ckpt = checkpoint_root(data_dir, RUN) / "step-00000003"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not names & {"optimizer.pt", "trainer_state.json", COMPLETE, "deepspeed", "ema_reference.safetensors"}  # no training state
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == AutoTokenizer.from_pretrained(str(ckpt)).apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    original = modeling.load_model(ckpt).eval()
    assert torch.equal(_logits(exported, ids), _logits(original, ids))
    step2 = modeling.load_model(checkpoint_root(data_dir, RUN) / "step-00000002").eval()
    assert not torch.equal(_logits(step2, ids), _logits(original, ids))  # the step asked for, not another

    # --dtype bfloat16: half the bytes, config.json says so, the logits of the rounded weights
    half = tmp_path / "hf-bf16"
    assert main(["export", RUN, "--out", str(half), "--data-dir", str(data_dir), "--dtype", "bfloat16"]) == 0  # newest: step 3
    with safe_open(str(half / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    config = json.loads((half / "config.json").read_text())
    assert "bfloat16" in (config.get("torch_dtype"), config.get("dtype"))
    model = AutoModelForCausalLM.from_pretrained(str(half), dtype=torch.float32).eval()
    rounded = modeling.load_model(ckpt).eval()
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in rounded.state_dict().items()})
    assert torch.equal(_logits(model, ids), _logits(rounded, ids))


def test_bad_input_exits_2_naming_the_available_steps(data_dir, tmp_path, capsys):
    out = str(tmp_path / "hf")
    assert main(["export", "nope", "--out", out, "--data-dir", str(data_dir)]) == Exit.usage
    assert f"no run 'nope' under {data_dir / 'runs'} (runs with a directory there: {RUN})" in capsys.readouterr().err
    assert main(["export", RUN, "--step", "7", "--out", out, "--data-dir", str(data_dir)]) == Exit.usage
    assert f"the checkpoint of step 7 does not exist; complete checkpoints of run '{RUN}': steps 2, 3" in capsys.readouterr().err
    cut = checkpoint_root(data_dir, RUN) / "step-00000005"
    cut.mkdir()
    (cut / "config.json").write_text("{}")
    try:
        assert main(["export", RUN, "--step", "5", "--out", out, "--data-dir", str(data_dir)]) == Exit.usage
        assert "step 5: it is incomplete (no COMPLETE marker" in capsys.readouterr().err
    finally:
        shutil.rmtree(cut)
    (tmp_path / "hf").mkdir()
    assert main(["export", RUN, "--out", out, "--data-dir", str(data_dir)]) == Exit.usage
    assert "exists: choose another directory or pass --force" in capsys.readouterr().err
    assert not (tmp_path / "hf" / "config.json").exists() and not list(tmp_path.glob(".hf.exporting"))


def test_the_export_is_served_by_vllm_as_is(data_dir, tmp_path):
    """`vllm serve <export>` with no --tokenizer: the chat template renders the transformers
    prompt and greedy decoding gives the transformers tokens (one server start)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from magic.rollout.vllm_server import VllmServer, VllmServerConfig

    require_vllm()
    out = tmp_path / "hf"
    assert main(["export", RUN, "--step", "3", "--out", str(out), "--data-dir", str(data_dir)]) == 0
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(ids):].tolist()
    server = VllmServer(VllmServerConfig(model=str(out), python=VLLM_PYTHON, max_model_len=128), tmp_path / "vllm" / "server.log").start(timeout=900)
    try:
        with httpx.Client(base_url=server.url, timeout=300) as http:
            rendered = http.post("/tokenize", json={"model": str(out), "messages": MESSAGES, "add_generation_prompt": True})
            assert rendered.status_code == 200, rendered.text
            assert rendered.json()["tokens"] == ids
            resp = http.post("/v1/completions", json={"model": str(out), "prompt": ids, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True})
            assert resp.status_code == 200, resp.text
            choice = resp.json()["choices"][0]
            assert choice["token_ids"] == expected
    finally:
        server.stop()


def test_an_output_it_cannot_write_exits_2_saying_why_before_any_work(data_dir, tmp_path, capsys):
    """`--out` onto a file (with --force too), into a missing or read-only directory: one line, no traceback."""
    a_file = tmp_path / "model.bin"
    a_file.write_text("x")
    for extra in ([], ["--force"]):
        assert main(["export", RUN, "--out", str(a_file), "--data-dir", str(data_dir), *extra]) == Exit.usage
        err = capsys.readouterr().err
        assert "is a file: --out names the model directory to write" in err and "pass --force" not in err and "Traceback" not in err
    assert main(["export", RUN, "--out", str(tmp_path / "missing" / "hf"), "--data-dir", str(data_dir)]) == Exit.usage
    err = capsys.readouterr().err
    assert "its parent directory" in err and "does not exist" in err
    # a place nobody may write, root included (the mode of a directory does not bind root)
    assert main(["export", RUN, "--out", "/proc/magic-export", "--data-dir", str(data_dir)]) == Exit.usage
    err = capsys.readouterr().err
    assert ("cannot write there" in err or "is not writable" in err) and "Traceback" not in err


def test_a_run_of_magic_local_is_found_and_named_with_the_flag_to_pass(data_dir, tmp_path, capsys, monkeypatch):
    from magic.learner.export import LOCAL_DATA_DIR

    monkeypatch.chdir(tmp_path)
    (tmp_path / LOCAL_DATA_DIR / "runs" / "local").mkdir(parents=True)
    assert main(["export", "local", "--out", str(tmp_path / "hf"), "--data-dir", str(data_dir)]) == Exit.usage
    assert f"`magic local` wrote a run 'local' under {LOCAL_DATA_DIR}: pass --data-dir {LOCAL_DATA_DIR}" in capsys.readouterr().err
