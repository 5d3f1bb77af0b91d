"""Checkpoints are self-contained and written off the step's critical path.

A checkpoint directory loads as it is — with transformers (model, tokenizer with its chat
template, generation config) and with vLLM's offline `LLM` (the CPU build in `.venv-vllm`,
`make vllm-venv`; skipped locally without it, a failure in CI) — and greedy decoding from it
gives the same tokens in both. The torch backend's checkpoint holds the weights of the moment it
was taken even though the next step trains while its files are written.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from learner_batches import scored_groups, stage
from vllm_venv import VLLM_PYTHON, require_vllm

from magic import modeling
from magic.config.schema import OptimConfig
from magic.learner.backends import TorchBackend
from magic.learner.checkpoints import latest_checkpoint
from magic.learner.trainer import Trainer

OPTIM = OptimConfig(max_grad_norm=1.0)
MESSAGES = [{"role": "user", "content": "Add 3+5+2"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The smallest Qwen2 vLLM's CPU backend runs (head_dim 32), with the demo tokenizer and its chat template."""
    from transformers.utils import logging as hf_logging

    from magic.demo.prepare import build_model

    hf_logging.disable_progress_bar()
    out = tmp_path_factory.mktemp("ckpt-model")
    build_model(out, seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    return out


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint taken after one step, written while the next step trains; and the weights at
    the moment it was taken."""
    torch.manual_seed(0)
    vocab = modeling.load_model_config(model_dir).vocab_size
    policy = modeling.load_model(model_dir)
    trainer = Trainer(TorchBackend(policy, OPTIM, torch.device("cpu")), OPTIM, pad_id=0, micro_batch_tokens=256, assets_from=str(model_dir))
    st = stage(beta=0.0)
    trainer.train_step(scored_groups(0, 4, 4, vocab, seed=1), version=0, stage=st)
    taken = {k: v.clone() for k, v in policy.state_dict().items()}
    root = tmp_path_factory.mktemp("ckpts")
    trainer.save_checkpoint(root, 1, keep=2)  # policy version 1 (after step 0); background: returns once the state is copied
    trainer.train_step(scored_groups(1, 4, 4, vocab, seed=2), version=1, stage=st)  # moves the live weights
    trainer.wait_for_checkpoint()
    ckpt = latest_checkpoint(root, version=1)
    assert ckpt is not None and ckpt.name == "step-00000001"
    moved = max((policy.state_dict()[k] - taken[k]).abs().max().item() for k in taken)
    assert moved > 0  # the live weights changed while the files were written
    return ckpt, taken


def test_checkpoint_holds_the_weights_of_its_step_and_everything_to_load_it(checkpoint, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ckpt, taken = checkpoint
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "optimizer.pt", "trainer_state.json", "COMPLETE"):
        assert (ckpt / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    got = model.state_dict()
    for k, v in taken.items():
        assert torch.equal(got[k], v), k  # the snapshot, not the weights trained after it
    tok, orig = AutoTokenizer.from_pretrained(str(ckpt)), AutoTokenizer.from_pretrained(str(model_dir))
    assert len(tok) == len(orig) > 1 and tok.chat_template == orig.chat_template is not None
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == orig.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    gen = GenerationConfig.from_pretrained(str(ckpt))
    assert gen.eos_token_id == orig.eos_token_id and gen.pad_token_id == orig.pad_token_id




VLLM_SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=128, enforce_eager=True, seed=0)
tok = llm.get_tokenizer()
prompt = tok.apply_chat_template(json.loads(sys.argv[2]), tokenize=False, add_generation_prompt=True, return_dict=False)
out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
print("RESULT " + json.dumps({"vocab": len(tok), "prompt_ids": list(out.prompt_token_ids), "ids": list(out.outputs[0].token_ids)}))
"""


def test_checkpoint_loads_in_vllm_as_is(checkpoint, tmp_path):
    """`LLM(model=<checkpoint>)` with no --tokenizer: vLLM finds tokenizer, chat template and
    weights in the directory, and greedy decoding gives the tokens transformers gives."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require_vllm()
    ckpt, _ = checkpoint
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
        env.pop(name, None)
    proc = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_SCRIPT, str(ckpt), json.dumps(MESSAGES)], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    got = json.loads(lines[-1][len("RESULT "):])

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    prompt_ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert got["vocab"] == len(tok) and got["prompt_ids"] == prompt_ids
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert got["ids"] == out[0, len(prompt_ids):].tolist()


def test_the_manifest_lists_every_files_digest_and_a_change_of_any_byte_is_caught(checkpoint, tmp_path):
    """Tensor data zeroed with the file's size and safetensors header kept (blocks a disk lost or a
    hostile writer replaced) passes every cheap check, and fails the digest check."""
    import shutil

    from magic.learner.checkpoints import COMPLETE, problem, unusable, verify

    ckpt, _ = checkpoint
    manifest = json.loads((ckpt / COMPLETE).read_text())
    assert manifest["step"] == 0 and manifest["policy_version"] == 1 and manifest["epoch"] == 0
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != COMPLETE}
    assert set(manifest["files"]) == on_disk and all(len(e["sha256"]) == 64 for e in manifest["files"].values())
    copy = tmp_path / "step-00000000"
    shutil.copytree(ckpt, copy)
    weights = copy / "model.safetensors"
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.seek(header)
        f.write(b"\0" * (size - header))
    assert weights.stat().st_size == size and problem(copy) is None  # sizes and header as written
    assert "model.safetensors does not match its SHA-256" in verify(copy)
    assert "does not match its SHA-256" in unusable(copy)
    assert latest_checkpoint(tmp_path) is None


def test_a_checkpoint_is_renamed_into_place_only_through_its_fence(model_dir, tmp_path):
    """The writer's fence is asked before the rename: refused, nothing lands. An intact checkpoint
    of the step is replaced only by a newer epoch's (a learner that lost its lease before committing
    the step wrote the older); a damaged one is replaced."""
    from magic.learner.checkpoints import COMPLETE, step_dir, verify

    policy = modeling.load_model(model_dir)
    trainer = Trainer(TorchBackend(policy, OPTIM, torch.device("cpu")), OPTIM, pad_id=0, micro_batch_tokens=256)
    final = step_dir(tmp_path, 3)

    def refuse():
        raise RuntimeError("the lease of learner A was lost")

    def written() -> tuple[int, str]:
        return final.stat().st_ino, (final / COMPLETE).read_text()

    trainer.save_checkpoint(tmp_path, 3, keep=5, background=False, fence=refuse, epoch=1)
    assert not final.exists() and not list(tmp_path.iterdir())
    trainer.save_checkpoint(tmp_path, 3, keep=5, background=False, fence=lambda: None, epoch=2)
    first = written()
    assert json.loads(first[1])["epoch"] == 2
    for epoch in (2, 1):  # the same epoch again, a stale one: kept as it is
        trainer.save_checkpoint(tmp_path, 3, keep=5, background=False, fence=lambda: None, epoch=epoch)
        assert written() == first
    trainer.save_checkpoint(tmp_path, 3, keep=5, background=False, fence=lambda: None, epoch=3)
    assert written() != first and json.loads(written()[1])["epoch"] == 3
    (final / "trainer_state.json").write_text('{"step": 3, "entropy_controller": {}}')  # damaged
    assert verify(final) is not None
    trainer.save_checkpoint(tmp_path, 3, keep=5, background=False, fence=lambda: None, epoch=3)
    assert verify(final) is None and json.loads((final / COMPLETE).read_text())["epoch"] == 3
    (final / "model.safetensors.index.json").write_text('{"weight_map": {}}')  # from_pretrained would follow it; the manifest does not vouch for it
    assert "model.safetensors.index.json is in the directory but not in its COMPLETE manifest" in verify(final)
    (final / "model.safetensors.index.json").unlink()
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000003"]
