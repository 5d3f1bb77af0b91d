"""The supervised warm start: a few steps on a very small model (the demo's shape is too slow here)."""

from magic.demo import task
from magic.demo.prepare import build_model
from magic.demo.sft import SFTConfig, train


def test_warm_start_lowers_the_loss_and_shows_progress_with_an_eta(tmp_path, capsys):
    model, tok = build_model(tmp_path, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    problems = task.make_splits(3, 200, 0, 0)["sft"]
    cfg = SFTConfig(steps=12, batch_size=8, micro_batches=2, warmup_steps=2)
    first = train(model, tok, problems, SFTConfig(steps=1, batch_size=8, micro_batches=2, warmup_steps=1))["sft_final_loss"]
    figures = train(model, tok, problems, cfg, progress=True)
    assert figures["sft_final_loss"] < first
    out = capsys.readouterr().out
    assert "warm start" in out and "12/12" in out and "<" in out  # tqdm's elapsed<remaining
