"""Mixed precision and activation checkpointing on CPU (torch's CPU bfloat16).

Stated tolerances (the tiny Qwen2 model of conftest, one step of `learner_batches.stage()`):
- bf16 vs fp32, one training step (N_SGD = 4): loss, pg_loss, entropy, kl_ref and grad_norm
  within 2e-2 relative; the weight update (all parameters as one vector) within 15% relative
  L2 difference and cosine >= 0.99.
- learner log-probs in bf16 vs the rollout engine's (float32 engine, published bf16 weights):
  max |difference| <= BF16_LOGPROB_ATOL = 0.05 nats per token (fp32 learner: <= 1e-4).
"""

from __future__ import annotations

import pytest
import torch
from learner_batches import scored_groups, stage

from magic import modeling
from magic.config.schema import OptimConfig
from magic.learner.backends import TorchBackend
from magic.learner.settings import LearnerSettings
from magic.learner.trainer import Trainer
from magic.learner.worker import publish_dtype
from magic.rollout.engine import GenerationRequest, TorchEngine
from magic.weights.filesystem import FilesystemWeightStore

OPTIM = OptimConfig(max_grad_norm=1.0)
BF16_LOGPROB_ATOL = 0.05
"""Largest |log pi| difference per token between the bf16 learner and the rollout engine."""


def make_trainer(model_dir, precision: str = "fp32", checkpointing: bool = False, budget: int = 10**6) -> Trainer:
    torch.manual_seed(0)
    model = modeling.load_model(model_dir)
    backend = TorchBackend(model, OPTIM, torch.device("cpu"), chunk_size=5, precision=precision, activation_checkpointing=checkpointing)
    ref = modeling.load_model(model_dir).requires_grad_(False).to(next(model.parameters()).dtype)
    return Trainer(backend, OPTIM, pad_id=0, micro_batch_tokens=budget, reference=ref, chunk_size=5)


def test_bf16_keeps_float32_master_weights_and_optimizer_state(tiny_model_dir):
    trainer = make_trainer(tiny_model_dir, "bf16")
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    trainer.train_step(scored_groups(0, 4, 4, vocab, seed=3), version=0, stage=stage())
    assert all(p.dtype == torch.bfloat16 for p in trainer.backend.policy.parameters())
    state = trainer.backend.optimizer.state
    assert state and all(v.dtype == torch.float32 for s in state.values() for k, v in s.items() if k != "step")
    full = trainer.backend.full_state_dict()
    assert all(v.dtype == torch.float32 for v in full.values())
    for name, p in trainer.backend.policy.named_parameters():  # the model holds the masters, rounded
        assert torch.equal(p.detach(), full[name].to(torch.bfloat16)), name


def test_bf16_master_weights_keep_updates_smaller_than_a_bf16_ulp(tiny_model_dir):
    """Adam moves each weight by about lr per step: at lr 1e-6 that is below half a bf16 spacing
    of almost every weight, so bf16 weights updated in place would never move; the float32
    masters accumulate the updates (and the model's weights are those masters, rounded)."""
    trainer = make_trainer(tiny_model_dir, "bf16")
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    w = "model.layers.0.mlp.up_proj.weight"
    master0 = trainer.backend.full_state_dict()[w].clone()
    model0 = dict(trainer.backend.policy.named_parameters())[w].detach().clone()
    st = stage(lr=1e-6, beta=0.0, entropy={"adaptive": False, "coef": 0.0})
    for k in range(3):
        trainer.train_step(scored_groups(k, 4, 4, vocab, seed=3), version=k, stage=st)
    master = trainer.backend.full_state_dict()[w]
    model = dict(trainer.backend.policy.named_parameters())[w].detach()
    assert (master != master0).float().mean().item() > 0.95  # 12 SGD steps reached the masters
    assert (master - master0).abs().max().item() > 5e-6
    per_step_sub_ulp = (1.5e-6 < master0.abs() * 2.0**-9).float().mean().item()
    assert per_step_sub_ulp > 0.9  # bf16 weights alone would have rounded these updates away
    assert torch.equal(model, master.to(torch.bfloat16)) and not torch.equal(model, model0)


def test_one_bf16_step_agrees_with_fp32_within_stated_tolerances(tiny_model_dir):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    batch = scored_groups(0, 4, 4, vocab, seed=3)
    init = modeling.export_state_dict(modeling.load_model(tiny_model_dir))
    out = {}
    for precision in ("fp32", "bf16"):
        trainer = make_trainer(tiny_model_dir, precision)
        out[precision] = (trainer.train_step(batch, version=0, stage=stage()), trainer.backend.full_state_dict())
    (r32, w32), (r16, w16) = out["fp32"], out["bf16"]
    for key in ("loss", "pg_loss", "entropy", "kl_ref", "grad_norm"):
        assert r16[key] == pytest.approx(r32[key], rel=2e-2, abs=1e-3), key
    assert r16["sgd_steps"] == r32["sgd_steps"] == 4
    # Adam's sign-like steps amplify bf16 noise on coordinates with tiny gradients, so the update
    # is compared as a whole: measured relative difference 0.075, cosine 0.997.
    d32 = torch.cat([(w32[k] - init[k]).flatten() for k in w32])
    d16 = torch.cat([(w16[k] - init[k]).flatten() for k in w32])
    assert ((d16 - d32).norm() / d32.norm()).item() <= 0.15
    assert torch.nn.functional.cosine_similarity(d16, d32, dim=0).item() >= 0.99


@pytest.fixture(scope="module")
def sharp_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with 10x larger (tied) embeddings: logits of several nats, entropy about 3
    (the untrained one is nearly uniform, which would hide any precision error)."""
    out = tmp_path_factory.mktemp("sharp-model")
    for f in tiny_model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            (out / f.name).write_bytes(f.read_bytes())
    model = modeling.load_model(tiny_model_dir)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(10.0)
    model.save_pretrained(out, safe_serialization=True)
    return out


def test_bf16_learner_logprobs_match_the_rollout_engine(sharp_model_dir, tmp_path):
    """Publish bf16 weights through the filesystem transport, sample with the rollout engine, and
    recompute the samples' log-probs in the bf16 learner."""
    settings = LearnerSettings(precision="bf16")
    trainer = make_trainer(sharp_model_dir, "bf16")
    store = FilesystemWeightStore(tmp_path / "weights")
    config_json = modeling.load_model_config(sharp_model_dir).to_json_string()
    directory, _, size16 = store.write(1, modeling.cast_state_dict(trainer.backend.full_state_dict(), publish_dtype(settings)), config_json)
    _, _, size32 = store.write(2, trainer.backend.full_state_dict(), config_json)
    assert size16 <= 0.55 * size32  # the transport's bytes halve (plus the safetensors header)

    engine = TorchEngine(str(sharp_model_dir))
    engine.load_checkpoint(FilesystemWeightStore.verify(directory, 1))
    prompts = [engine.render_prompt([{"role": "user", "content": c}]) for c in ("Add 1+2", "Add 3+4+5+6")]
    results, _ = engine.generate([GenerationRequest(p, n=4, temperature=0.8, max_tokens=24, seed=7) for p in prompts])
    worst = {"bf16": 0.0, "fp32": 0.0}
    fp32_policy = modeling.load_model(sharp_model_dir)
    modeling.load_state_dict(fp32_policy, modeling.cast_state_dict(trainer.backend.full_state_dict(), torch.bfloat16))
    for p, samples in zip(prompts, results):
        for s in samples:
            ids = torch.tensor([p + s.token_ids])
            sampler = torch.tensor(s.logprobs)
            with torch.no_grad():
                logp16, _ = trainer.backend.forward(ids, torch.ones_like(ids), 0.8)
                logp32, _ = modeling.token_logprobs(fp32_policy, ids, torch.ones_like(ids), 0.8)
            assert logp16.dtype == torch.float32  # float32 log-probs from the bf16 model
            worst["bf16"] = max(worst["bf16"], (logp16[0, len(p) - 1 :] - sampler).abs().max().item())
            worst["fp32"] = max(worst["fp32"], (logp32[0, len(p) - 1 :] - sampler).abs().max().item())
    assert worst["fp32"] <= 1e-4, worst
    print(f"max |learner - sampler| log-prob: bf16 {worst['bf16']:.4f}, fp32 {worst['fp32']:.2e}")
    assert 0 < worst["bf16"] <= BF16_LOGPROB_ATOL, worst


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_checkpointing_gives_the_same_step(tiny_model_dir, precision):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    batch = scored_groups(0, 4, 4, vocab, seed=3)
    out = []
    for checkpointing in (False, True):
        trainer = make_trainer(tiny_model_dir, precision, checkpointing, budget=28)
        assert trainer.backend.policy.is_activation_checkpointing == checkpointing
        out.append((trainer.train_step(batch, version=0, stage=stage()), trainer.backend.full_state_dict()))
    (a, wa), (b, wb) = out
    for key in ("loss", "pg_loss", "entropy", "kl_ref", "grad_norm"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=0, atol=1e-6), k


def test_publish_dtype_follows_the_precision_unless_set():
    assert publish_dtype(LearnerSettings(precision="bf16")) == torch.bfloat16
    assert publish_dtype(LearnerSettings(precision="fp32")) == torch.float32
    assert publish_dtype(LearnerSettings(precision="fp32", publish_dtype="bfloat16")) == torch.bfloat16
    with pytest.raises(ValueError):
        LearnerSettings(precision="fp16")


def test_bf16_checkpoint_keeps_the_masters_and_resumes_the_same_step(tiny_model_dir, tmp_path):
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    batches = [scored_groups(k, 4, 4, vocab, seed=5) for k in range(2)]
    straight = make_trainer(tiny_model_dir, "bf16")
    straight.train_step(batches[0], version=0, stage=stage())
    straight.save_checkpoint(tmp_path, 1, keep=1, background=False)  # the policy after step 0
    expected = straight.train_step(batches[1], version=1, stage=stage())

    ckpt = tmp_path / "step-00000001"
    saved = modeling.load_model(ckpt)  # the HF copy holds the float32 masters, not their bf16 rounding
    assert any(not torch.equal(p, p.to(torch.bfloat16).float()) for p in saved.parameters())
    resumed = make_trainer(ckpt, "bf16")
    resumed.reference = straight.reference  # pi_ref is the initial model, not the checkpoint
    resumed.load_checkpoint(ckpt)
    again = resumed.train_step(batches[1], version=1, stage=stage())
    for key in ("loss", "pg_loss", "entropy", "kl_old", "grad_norm"):
        assert again[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key
    for k, v in straight.backend.full_state_dict().items():
        assert torch.equal(resumed.backend.full_state_dict()[k], v), k
