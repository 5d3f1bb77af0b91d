"""The learner's memory plan (`magic.learner.memory`, `magic memory`): parameter counts, how each
knob moves each component, the refusal naming the knob, and the chart's GPU examples checked by
the plan (7B and 32B on 80 GB GPUs). Predicted vs measured peak memory: benchmarks/learner_memory.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from magic.cli import main
from magic.learner import memory
from magic.learner.memory import GiB, LearnerShape, ModelShape

ROOT = Path(__file__).resolve().parents[3]
CI = ROOT / "charts" / "magic" / "ci"
MODEL_7B = CI / "models" / "DeepSeek-R1-Distill-Qwen-7B"
MODEL_32B = CI / "models" / "DeepSeek-R1-Distill-Qwen-32B"


@pytest.mark.parametrize("cfg", [
    dict(model_type="qwen2", hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True),
    dict(model_type="qwen2", hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, vocab_size=250, tie_word_embeddings=False),
    dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=320, tie_word_embeddings=False),
])
def test_parameter_count_is_the_models(cfg):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert ModelShape.from_config(config.to_dict()).params == sum(p.numel() for p in model.parameters())


def test_example_models_have_their_published_sizes():
    assert ModelShape.from_path(MODEL_7B).params == 7_615_616_512
    assert ModelShape.from_path(MODEL_32B).params == 32_763_876_352


def test_each_knob_moves_its_components():
    model = ModelShape.from_path(MODEL_7B)
    base = LearnerShape(gpus=8, nodes=2, zero_stage=2, precision="bf16", activation_checkpointing=False, micro_batch_tokens=16384, sequence_tokens=16384)
    c = memory.per_rank_components(model, base)
    P = model.params
    assert c["weights"] == P * 2 and c["optimizer"] == int(12 * P / 16)
    z3 = memory.per_rank_components(model, replace(base, zero_stage=3))
    assert z3["weights"] == int(P * 2 / 16) and "gathered" in z3 and z3["optimizer"] == c["optimizer"]
    z1 = memory.per_rank_components(model, replace(base, zero_stage=1))
    assert z1["gradients"] == P * 2 > c["gradients"]
    ckpt = memory.per_rank_components(model, replace(base, activation_checkpointing=True))
    assert ckpt["activations"] < c["activations"] / 5
    fp32 = memory.per_rank_components(model, replace(base, precision="fp32"))
    assert fp32["weights"] == 2 * c["weights"] and fp32["activations"] > c["activations"]
    twice = memory.per_rank_components(model, replace(base, micro_batch_tokens=32768, sequence_tokens=32768))
    assert twice["activations"] == pytest.approx(2 * c["activations"], rel=1e-6)
    longer_seq = memory.per_rank_components(model, replace(base, sequence_tokens=40000))  # one sequence over the budget
    assert longer_seq["activations"] > c["activations"]
    ref = memory.per_rank_components(model, replace(base, reference="initial"))
    assert ref["reference"] == P * 2
    assert memory.per_rank_components(model, replace(base, zero_stage=3, reference="initial"))["reference"] == int(P * 2 / 16)
    assert memory.per_rank_components(model, replace(base, reference="ema"))["reference"] == P * 4
    assert memory.per_rank_components(model, base, rank0=False).get("publish") is None


def test_a_streamed_step_counts_its_gradient_buffers():
    """One policy-sized float32 buffer per loss term a streamed step accumulates apart, on the torch
    backend only, and none where nothing is backpropagated before the last group; a stage that fits
    barrier-trained but not with its buffers is refused."""
    from magic.config.schema import StageConfig
    from magic.learner.settings import LearnerSettings

    streamed, barrier = LearnerSettings(stream=True, backend="torch"), LearnerSettings(stream=False, backend="torch")
    base = dict(steps=1, T=16, D_R=8, gs=4, entropy={"adaptive": False, "coef": 0.0})

    def stage(**overrides) -> StageConfig:
        return StageConfig.model_validate({**base, **overrides})

    on_policy = stage()
    assert memory.stream_buffer_count(on_policy, streamed) == 1 and memory.stream_buffer_count(on_policy, barrier) == 0
    every_term = stage(advantage_estimator="batch", entropy={"adaptive": True}, beta=0.01)
    assert memory.stream_buffer_count(every_term, streamed) == 4
    assert memory.stream_buffer_count(every_term, LearnerSettings(stream=True, backend="deepspeed")) == 0
    assert memory.stream_buffer_count(stage(D_T=4), streamed) == 0  # rule count: only the no-grad pass streams
    assert memory.stream_buffer_count(stage(D_T=4, minibatch_rule="slot"), streamed) == 1

    recipe = StageConfig.model_validate({"steps": 1, "T": 16, "D_R": 8, "gs": 4})  # the rest the schema's defaults: the recipe's stage
    assert memory.stream_buffer_count(recipe, LearnerSettings()) == memory.RECIPE_STREAM_BUFFERS
    assert memory.shape_from_values({"learner": {"gpus": 1}}, 4096).stream_buffers == memory.RECIPE_STREAM_BUFFERS  # `magic memory` on one rank
    assert memory.shape_from_values({"learner": {"gpus": 8}}, 4096).stream_buffers == 0

    model = ModelShape.from_path(MODEL_7B)
    one_gpu = LearnerShape(backend="torch", zero_stage=0, precision="bf16", micro_batch_tokens=4096, sequence_tokens=4096, device_bytes=None)
    base = memory.per_rank_components(model, one_gpu)
    assert "stream_buffers" not in base
    c = memory.per_rank_components(model, replace(one_gpu, stream_buffers=2))
    assert c["stream_buffers"] == 2 * model.params * 4
    assert memory.peak_bytes(c) - memory.peak_bytes(base) == 2 * model.params * 4  # held through the step
    fits = memory.peak_bytes(base) / 0.9 * 1.001
    assert memory.plan(model, replace(one_gpu, device_bytes=int(fits))).fits
    assert not memory.plan(model, replace(one_gpu, device_bytes=int(fits), stream_buffers=1)).fits


def test_a_shape_that_does_not_fit_names_the_knob():
    model = ModelShape.from_path(MODEL_7B)
    one_gpu = LearnerShape(gpus=1, nodes=1, backend="torch", precision="fp32", activation_checkpointing=False)
    p = memory.plan(model, one_gpu)
    assert not p.fits and "MAGIC_PRECISION=bf16" in p.problems[0] and "learner.gpus" in p.problems[0]
    z2 = LearnerShape(gpus=8, nodes=1, zero_stage=2, precision="bf16", activation_checkpointing=False, sequence_tokens=33792)
    p = memory.plan(model, z2)
    assert not p.fits and "activationCheckpointing" in p.problems[0]
    big = ModelShape.from_path(MODEL_32B)
    p = memory.plan(big, LearnerShape(gpus=8, nodes=1, zero_stage=2, precision="bf16", activation_checkpointing=True))
    assert not p.fits and "learner.zeroStage: 3" in p.problems[0] and "learner.nodes" in p.problems[0]
    assert "does not fit" in p.table() and "rank 0 needs" in p.table()


def test_a_needed_node_count_fits_and_one_less_does_not():
    big = ModelShape.from_path(MODEL_32B)
    shape = LearnerShape(gpus=8, nodes=1, zero_stage=3, precision="bf16", activation_checkpointing=True, sequence_tokens=33792)
    usable = 0.9 * 80e9
    need, stage = memory.needed_nodes(big, shape, usable)
    assert need > 1 and stage == 3
    assert memory.plan(big, replace(shape, nodes=need)).fits
    assert not memory.plan(big, replace(shape, nodes=need - 1)).fits


@pytest.mark.parametrize("values, model, T", [("gpu-7b-values.yaml", MODEL_7B, 16384), ("gpu-7b-values.yaml", MODEL_7B, 32768), ("gpu-32b-values.yaml", MODEL_32B, 16384)])
def test_the_gpu_examples_fit_80_gb_gpus(values, model, T, capsys):
    """The chart's GPU examples: bf16, activation checkpointing, and the plan says they fit (with
    the 10% margin) at the T they are documented for."""
    learner = yaml.safe_load((CI / values).read_text())["learner"]
    assert learner["precision"] == "bf16" and learner["activationCheckpointing"] is True
    assert main(["memory", str(model), "-f", str(CI / values), "--T", str(T)]) == 0
    out = capsys.readouterr().out
    assert "\nfits\n" in out and "of 74.5 GiB (usable 67.1 GiB with a 10% margin)" in out


def test_the_32b_example_at_32k_asks_for_more_nodes(capsys):
    assert main(["memory", str(MODEL_32B), "-f", str(CI / "gpu-32b-values.yaml"), "--T", "32768"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"learner\.nodes \d+ \(now 4\) fits", out) and "sequences are not split" in out


def test_memory_command_json_and_flags(capsys):
    assert main(["memory", str(MODEL_7B), "--gpus", "8", "--nodes", "2", "--zero-stage", "3", "--precision", "bf16", "--activation-checkpointing", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] and plan["params"] == 7_615_616_512 and plan["rank_total"] == memory.peak_bytes(plan["per_rank"])
    assert plan["per_rank"]["weights"] == int(7_615_616_512 * 2 / 16)


@pytest.mark.parametrize("argv, message", [
    (["memory", "/nonexistent/model"], "cannot read"),
    (["memory", "{model}", "--T", "0"], "--T 0: must be at least 1"),
    (["memory", "{model}", "--gpu-memory", "lots"], "not a memory size"),
    (["memory", "{bad}"], "not a decoder config"),
    (["memory", "{moe}"], "mixture-of-experts"),
    (["memory", "{model}", "-f", "{values_bad}"], "learner.precision"),
    (["memory", "{model}", "-f", "{not_yaml}"], "not YAML"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "moe.json").write_text(json.dumps({"hidden_size": 8, "num_local_experts": 8}))
    (tmp_path / "values.yaml").write_text("learner: {precision: fp8}\n")
    (tmp_path / "v.yaml").write_text("learner: [unclosed\n")
    subs = dict(model=str(MODEL_7B), bad=str(tmp_path / "bad.json"), moe=str(tmp_path / "moe.json"), values_bad=str(tmp_path / "values.yaml"), not_yaml=str(tmp_path / "v.yaml"))
    assert main([a.format(**subs) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_parse_bytes():
    assert memory.parse_bytes("80GB") == 80 * 10**9 and memory.parse_bytes("80Gi") == 80 * GiB and memory.parse_bytes("1Ti") == 2**40
    for bad in ("", "GB", "-1Gi", "1 XB", "nan"):
        with pytest.raises(ValueError):
            memory.parse_bytes(bad)
