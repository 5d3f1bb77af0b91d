"""Local held-out evaluation on the tiny model: `magic eval --local` against a recomputation, and
the shared evaluator against the one `magic local` had before it (kept here as the reference):
the same requests reach the engine and the same accuracy, truncation and length come out."""

from __future__ import annotations

import collections
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from magic.cli import main
from magic.controller.datasets import PromptRecord, load_jsonl
from magic.demo import task
from magic.local import evaluate as ev
from magic.protocol.pb import messages_pb2 as pb
from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import RewardSettings
from magic.rollout.engine import GenerationRequest, RolloutEngine, TorchEngine

pytestmark = pytest.mark.integration


@dataclass
class OldEvalResult:
    accuracy: float
    truncated: float
    response_length: float
    samples: int


def old_evaluate(engine: RolloutEngine, records: list[PromptRecord], samples_per_prompt: int, temperature: float, max_tokens: int, seed: int = 1234) -> OldEvalResult:
    """services/magic/local/evaluate.py's evaluate() before the shared evaluator replaced it, verbatim."""
    requests = [
        GenerationRequest(
            engine.render_prompt([{"role": r, "content": c} for r, c in rec.messages]),
            n=samples_per_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed + i,
        )
        for i, rec in enumerate(records)
    ]
    results, _ = engine.generate(requests)
    generated = [(rec, s) for rec, samples in zip(records, results) for s in samples]
    problem = lambda rec: next((c for r, c in reversed(rec.messages) if r == "user"), "")  # noqa: E731
    with Scorer(RewardSettings()) as scorer:
        scores = scorer.score_many([Sample(rec.data_source, s.text, rec.ground_truth, problem(rec)) for rec, s in generated])
    n = len(generated)
    correct = sum(score.correctness for score in scores)
    truncated = sum(s.finish_reason == pb.FINISH_REASON_LENGTH for _, s in generated)
    length = sum(len(s.token_ids) for _, s in generated)
    return OldEvalResult(correct / n, truncated / n, length / n, n)


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "held.jsonl"
    task.write_jsonl(path, [task.record(t, "eval", i) for i, t in enumerate(task.make_splits(3, 0, 0, 12)["eval"])])
    return path


def _recording(engine: TorchEngine) -> list[list[GenerationRequest]]:
    """Record every batch of requests the engine is asked to generate."""
    calls: list[list[GenerationRequest]] = []
    generate = engine.generate

    def spy(requests):
        calls.append(list(requests))
        return generate(requests)

    engine.generate = spy
    return calls


def test_the_shared_evaluator_sends_the_same_requests_and_reports_the_old_figures(tiny_model_dir, held_out):
    records = load_jsonl(held_out)
    engine = TorchEngine(str(tiny_model_dir), max_batch_sequences=1024)
    calls = _recording(engine)
    kwargs = dict(samples_per_prompt=3, temperature=1.0, max_tokens=10)
    old = old_evaluate(engine, records, **kwargs)
    new = ev.evaluate(engine, records, **kwargs)
    assert calls[0] == calls[1]  # prompts, n, temperature, top_p, max_tokens, seeds
    assert old.truncated > 0 and old.response_length > 0  # T = 10 cuts some of the untrained model's answers
    assert (new.avg_at_n, new.truncated_ratio, new.response_length_mean, new.prompts * new.samples) == (old.accuracy, old.truncated, old.response_length, old.samples)


def test_avg_at_n_is_the_old_accuracy_to_the_bit_with_mixed_correctness():
    """The untrained model answers nothing right, so the engine test cannot tell the two averages
    apart; on random correctness (n = 3 and 4, 500 prompts, as `magic local`'s default) they agree
    exactly — avg@n is one division, correct samples / samples."""
    import random

    from magic.evaluation import PromptOutcome, summarise

    rng = random.Random(7)
    for n in (3, 4, 5):
        for _ in range(50):
            rows = [[rng.random() < 0.3 for _ in range(n)] for _ in range(500)]
            outcomes = [PromptOutcome.of([float(c) for c in row], [1] * n, [False] * n) for row in rows]
            assert summarise(outcomes).avg_at_n == sum(sum(row) for row in rows) / (500 * n)


def test_magic_eval_local_writes_figures_that_match_a_recomputation(tiny_model_dir, held_out, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--local", str(tiny_model_dir), "-d", str(held_out), "-n", "4", "--pass-k", "2", "--T", "12", "--seed", "99", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    f = report["figures"]["held"]
    assert "held" in table and "pass@2" in table and f"{f['avg_at_n']:.3f}" in table
    records = load_jsonl(held_out)
    assert (report["samples"], report["k"], report["max_tokens"], report["seed"], f["prompts"]) == (4, 2, 12, 99, len(records))
    # the samples again, drawn independently with the same seeds, and scored again
    engine = TorchEngine(str(tiny_model_dir))
    results, _ = engine.generate([GenerationRequest(engine.render_prompt([{"role": r, "content": c} for r, c in rec.messages]), n=4, temperature=1.0, max_tokens=12, seed=99 + i) for i, rec in enumerate(records)])
    with Scorer(RewardSettings()) as scorer:
        for rec, group, row in zip(records, results, report["prompts"]):
            assert row["uid"] == rec.uid
            assert row["lengths"] == [len(s.token_ids) for s in group]
            assert row["truncated"] == [s.finish_reason == pb.FINISH_REASON_LENGTH for s in group]
            scores = scorer.score_many([Sample(rec.data_source, x.text, rec.ground_truth, rec.messages[-1][1]) for x in group])
            assert row["correct"] == [s.correctness == 1.0 for s in scores] and row["answers"] == [s.answer for s in scores]
    # the figures, recomputed from those outcomes with the binomial form of Chen et al.
    c = [sum(row["correct"]) for row in report["prompts"]]
    samples = [(n, t) for row in report["prompts"] for n, t in zip(row["lengths"], row["truncated"])]
    assert f["avg_at_n"] == pytest.approx(sum(x / 4 for x in c) / len(c))
    assert f["pass_at_k"] == pytest.approx(sum(1 - math.comb(4 - x, 2) / math.comb(4, 2) for x in c) / len(c))
    assert f["response_length_mean"] == pytest.approx(sum(n for n, _ in samples) / len(samples))
    assert f["truncated_ratio"] == pytest.approx(sum(t for _, t in samples) / len(samples)) and 0 < f["truncated_ratio"] < 1
    assert f["pass_at_k_ci_low"] <= f["pass_at_k"] <= f["pass_at_k_ci_high"]
    majority = []  # maj@4: the most frequent answer (ties shared, no answer no vote), from the rows
    for row in report["prompts"]:
        votes = collections.Counter(True if ok else a.replace(" ", "") for a, ok in zip(row["answers"], row["correct"]))
        votes.pop("", None)
        top = [a for a, n in votes.items() if n == max(votes.values())] if votes else []
        majority.append(top.count(True) / len(top) if top else 0.0)
    if any(a for row in report["prompts"] for a in row["answers"]) or not any(c for row in report["prompts"] for c in row["correct"]):
        assert f["maj_at_n"] == pytest.approx(sum(majority) / len(majority)) and "maj@4" in table
    else:
        assert f["maj_at_n"] is None


def test_magic_eval_local_refuses_what_it_cannot_use_before_any_work(tiny_model_dir, held_out, tmp_path, capsys):
    """An --out it cannot write, a directory with a config but no weights or no tokenizer (what a
    published weights version or a short run leaves): exit 2, one line, nothing computed."""
    run = ["eval", "--local", str(tiny_model_dir), "-d", str(held_out), "-n", "1", "--T", "4"]
    assert main([*run, "--out", str(tmp_path / "results" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "does not exist" in err and "Traceback" not in err
    assert main([*run, "--out", str(tmp_path)]) == 2 and "is a directory" in capsys.readouterr().err
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    shutil.copy(tiny_model_dir / "config.json", weightless / "config.json")
    assert main(["eval", "--local", str(weightless), "-d", str(held_out), "-n", "1"]) == 2
    assert "holds a config but no weights" in capsys.readouterr().err
    tokenless = tmp_path / "tokenless"
    tokenless.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.is_file() and not f.name.startswith("tokenizer") and f.name not in ("special_tokens_map.json", "vocab.json", "merges.txt"):
            shutil.copy(f, tokenless / f.name)
    assert main(["eval", "--local", str(tokenless), "-d", str(held_out), "-n", "1"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_results_are_kept_when_their_file_cannot_be_written_after_all(tmp_path, capsys):
    from magic.cli import write_results

    gone = tmp_path / "gone"
    gone.mkdir()
    target = gone / "x.json"
    gone.rmdir()  # the directory went away while the evaluation ran
    assert write_results(str(target), {"figures": {"held": {"avg_at_n": 0.5}}}) != 0
    err = capsys.readouterr().err
    rescue = err.rsplit("the results are in ", 1)[1].strip()
    assert json.loads(Path(rescue).read_text())["figures"]["held"]["avg_at_n"] == 0.5
    Path(rescue).unlink()
