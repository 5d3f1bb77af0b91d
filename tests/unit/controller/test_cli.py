"""The CLI's parsing and rendering, and the client's error messages (no controller needed)."""

import pytest

from magic.cli import build_parser, main, parse_plateau, render_status
from magic.config.flags import merge, model_overrides
from magic.config.schema import EntropyControl, PlateauRule, StageConfig
from magic.controller.client import ControllerClient, format_detail
from magic.runtime.exits import EXIT_MEANING, Exit, exit_for_status


def test_stage_flags_use_the_paper_names():
    args = build_parser().parse_args(["stage", "start", "r", "--T", "8192", "--D_R", "64", "--gs", "16", "--tgt-ent", "0.2", "--delta", "0.005"])
    stage = model_overrides(args, StageConfig, "stage")
    assert stage == {"context_length": 8192, "rollout_batch_size": 64, "group_size": 16, "entropy": {"target": 0.2, "delta": 0.005}}


def test_every_scalar_stage_field_has_a_flag_with_its_docstring():
    """Flags are generated from StageConfig: a field added to the schema gets one without a CLI change."""
    stage = build_parser()._subparsers._group_actions[0].choices["stage"]
    start = stage._subparsers._group_actions[0].choices["start"]
    dests = {a.dest: a for a in start._actions}
    for name, field in StageConfig.model_fields.items():
        if name in ("plateau", "penalties"):  # optional nested models come from a file (magic.config.flags)
            continue
        if name == "entropy":
            for sub, sub_field in EntropyControl.model_fields.items():
                assert sub_field.description.split()[0] in dests[f"stage__entropy__{sub}"].help
            continue
        assert field.description.split()[0] in dests[f"stage__{name}"].help, name


def test_flags_override_a_file_field_by_field_in_any_spelling():
    base = {"name": "s", "steps": 4, "T": 64, "D_R": 8, "gs": 4, "tgt_ent": 0.3, "entropy": {"delta": 0.01}}
    args = build_parser().parse_args(["stage", "start", "r", "--context-length", "128", "--tgt-ent", "0.1", "--no-online-filter"])
    stage = StageConfig(**merge(StageConfig, base, model_overrides(args, StageConfig, "stage")))
    assert (stage.context_length, stage.entropy.target, stage.entropy.delta, stage.online_filter) == (128, 0.1, 0.01, False)
    assert (stage.rollout_batch_size, stage.group_size) == (8, 4)


def test_left_out_flags_keep_the_schema_defaults():
    args = build_parser().parse_args(["stage", "start", "r", "--steps", "3", "--T", "8", "--D_R", "2", "--gs", "2"])
    stage = StageConfig(**model_overrides(args, StageConfig, "stage"))
    assert stage == StageConfig(steps=3, context_length=8, rollout_batch_size=2, group_size=2)


def test_plateau_parts_left_out_keep_the_rule_defaults():
    assert parse_plateau("reward_mean") == {"metric": "reward_mean"}
    assert PlateauRule(**parse_plateau(":3:0.5")) == PlateauRule(window=3, min_delta=0.5)
    with pytest.raises(ValueError, match="window must be int"):
        parse_plateau("reward_mean:x")


@pytest.mark.parametrize(
    "status, code",
    [(None, Exit.unreachable), (400, Exit.usage), (422, Exit.usage), (401, Exit.auth), (403, Exit.auth), (404, Exit.not_found), (409, Exit.conflict), (500, Exit.failed)],
)
def test_each_failure_class_has_its_exit_status(status, code):
    assert exit_for_status(status) == code


def test_exit_statuses_are_distinct_and_documented(capsys):
    assert len({e.value for e in Exit}) == len(Exit) and set(EXIT_MEANING) == set(Exit)
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(f"  {e.value:<4d}{EXIT_MEANING[e]}" in text for e in Exit)


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"magic {version('magic-rl')}"


def test_validation_errors_are_shown_field_by_field():
    text = format_detail([{"loc": ["body", "stages", 0, "D_T"], "msg": "D_R = 8 is not divisible by D_T = 3"}])
    assert text == "  stages.0.D_T: D_R = 8 is not divisible by D_T = 3"


def test_unreachable_controller_is_explained(monkeypatch):
    from magic.controller.client import ClientError
    from magic.runtime.ports import free_port

    monkeypatch.delenv("MAGIC_API_TOKEN", raising=False)
    client = ControllerClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ClientError, match="cannot reach the controller"):
        client.runs()


def test_status_rendering():
    view = {
        "name": "r", "status": "running", "phase": "rollout", "step": 3, "total_steps": 10, "policy_version": 3,
        "stage": 1, "stage_name": "long", "context_length": 96, "error": None,
        "workers": {"rollout": {"a": {}}, "reward": {}, "learner": {"l": {}}},
        "throughput": {"steps_per_hour": 120.0, "samples_per_second": 4.0, "response_tokens_per_second": 200.0},
        "filtering": {"dropped_online": 2, "dropped_estimated_0": 0, "dropped_estimated_all": 0},
        "stages": [{"index": 0, "name": "short", "context_length": 72, "start_step": 0, "end_step": 2, "end_reason": "steps", "prompts": 10, "dropped_online": 0}],
        "last_metrics": {"step": 2, "reward_mean": 0.5, "accuracy_all": 0.5},
        "validation": {"policy_version": 2, "datasets": {"aime": {
            "prompts": 30, "samples": 8, "k": 4, "avg_at_n": 0.25, "pass_at_k": 0.5, "pass_at_k_ci_low": 0.3, "pass_at_k_ci_high": 0.7,
            "response_length_mean": 812.0, "truncated_ratio": 0.125}}},
    }
    text = render_status(view)
    assert "held-out (policy version 2):" in text
    assert "aime" in text and "avg@8 0.250" in text and "pass@4 0.500" in text and "[0.300, 0.700]" in text and "812.0" in text
    assert "run r: running" in text and "stage 1 'long'  T=96" in text and "rollout 1, reward 0, learner 1" in text
    assert "filtered prompts: online 2" in text and "ended at step 2 (steps)" in text and "reward_mean 0.500" in text


# -- magic eval: bad input exits 2 with the reason, before any model is loaded ------------------


def _dataset(tmp_path, ground_truth="7"):
    path = tmp_path / "held.jsonl"
    path.write_text('{"prompt": [{"role": "user", "content": "Add 3+4"}], "data_source": "magic/chain-sum", "reward_model": {"ground_truth": "%s"}}\n' % ground_truth)
    return path


@pytest.mark.parametrize(
    "flags, message",
    [
        (["-n", "0"], "--samples: Input should be greater than or equal to 1, got 0"),
        (["-n", "2", "--pass-k", "3"], "pass_k = 3 exceeds samples = 2"),
        (["--T", "0"], "--T: Input should be greater than or equal to 1"),
        (["--temperature", "-1"], "--temperature: Input should be greater than or equal to 0"),
        (["--temperature", "0"], "tau = 0 is greedy decoding"),  # with the default 4 samples: set -n 1
    ],
)
def test_eval_refuses_bad_flags(tmp_path, capsys, flags, message):
    assert main(["eval", "--local", str(tmp_path), "-d", str(_dataset(tmp_path)), *flags]) == Exit.usage
    assert message in capsys.readouterr().err


def test_eval_refuses_a_missing_dataset_and_one_without_ground_truth(tmp_path, capsys):
    assert main(["eval", "--local", str(tmp_path), "-d", str(tmp_path / "nope.jsonl")]) == Exit.usage
    assert "nope.jsonl: no such file" in capsys.readouterr().err
    assert main(["eval", "--local", str(tmp_path), "-d", str(_dataset(tmp_path, ground_truth=" "))]) == Exit.usage
    assert "record held:1 has no ground truth" in capsys.readouterr().err


def test_eval_refuses_an_unknown_model_and_an_incomplete_checkpoint(tmp_path, capsys):
    data = str(_dataset(tmp_path))
    assert main(["eval", "--local", str(tmp_path / "missing"), "-d", data]) == Exit.usage
    assert "missing: no such model directory or checkpoint" in capsys.readouterr().err
    assert main(["eval", "--local", str(tmp_path), "-d", data]) == Exit.usage
    assert "not a Hugging Face model directory or checkpoint (no config.json)" in capsys.readouterr().err
    step = tmp_path / "step-00000004"
    step.mkdir()
    (step / "config.json").write_text("{}")
    assert main(["eval", "--local", str(step), "-d", data]) == Exit.usage
    assert "a checkpoint, but it is incomplete (no COMPLETE marker" in capsys.readouterr().err


# -- magic eval --run: through the controller ------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "-d", "aime"], "give --run RUN to evaluate a run's current policy through the services, or --local MODEL_OR_CHECKPOINT"),
        (["eval", "-d", "aime"], "a checkpoint is evaluated with --local, or through the services by a run with no stages"),
        (["eval", "--run", "r", "--local", "m", "-d", "aime"], "not both"),
        (["eval", "--local", "-d", "a.jsonl"], "--local needs a model directory or a learner checkpoint"),
        (["eval", "--local", "m", "-d", "a.jsonl", "-d", "b.jsonl"], "give exactly one -d"),
        (["eval", "--run", "r", "ckpt", "-d", "aime"], "'ckpt' is a target for --local only"),
        (["eval", "--run", "r", "-d", "aime", "--seed", "3"], "--seed is for --local"),
        (["eval", "--run", "r"], "--run needs at least one registered dataset"),
        (["eval", "--run", "r", "--id", "3", "-d", "aime"], "--id follows eval 3 as it was posted"),
        (["eval", "--run", "r", "-d", "aime", "--out", "x.json"], "--out writes the figures once the eval is done: add --wait"),
        (["eval", "--run", "r", "-d", "aime", "-n", "0"], "--samples: Input should be greater than or equal to 1"),
        (["eval", "--run", "r", "-d", "aime", "-n", "2", "--pass-k", "4"], "pass_k = 4 exceeds samples = 2"),
        (["eval", "--run", "r", "-d", "aime", "--wait", "--interval", "0"], "--interval must be positive"),
    ],
)
def test_eval_run_refuses_bad_flags_before_calling_the_controller(monkeypatch, capsys, argv, message):
    import magic.cli

    monkeypatch.setattr(magic.cli, "ControllerClient", lambda *a, **k: pytest.fail("the controller was called"))
    assert main(argv) == Exit.usage
    assert message in capsys.readouterr().err


class FakeEvals:
    """The controller's eval endpoints: an eval that is pending, then running, then `end`."""

    def __init__(self, end: dict):
        self.posted: list[tuple[str, dict]] = []
        self.polls = 0
        self.end = end

    def __call__(self, url, token):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def create_eval(self, run, body):
        self.posted.append((run, body))
        return {"id": "4", "status": "pending"}

    def eval(self, run, eval_id):
        assert (run, eval_id) == ("r", "4")
        self.polls += 1
        return {"id": "4", "status": "running", "policy_version": 7} if self.polls < 2 else {"id": "4", **self.end}


FIGURES = {"aime": {"prompts": 30, "samples": 8, "k": 4, "avg_at_n": 0.25, "pass_at_k": 0.5, "pass_at_k_ci_low": 0.3, "pass_at_k_ci_high": 0.7, "response_length_mean": 812.0, "truncated_ratio": 0.125}}


def test_eval_run_posts_the_request_polls_prints_and_writes(monkeypatch, capsys, tmp_path):
    import json

    import magic.cli

    fake = FakeEvals({"status": "done", "policy_version": 7, "context_length": 64, "figures": FIGURES})
    monkeypatch.setattr(magic.cli, "ControllerClient", fake)
    out = tmp_path / "eval.json"
    argv = ["eval", "--run", "r", "-d", "aime", "-d", "math", "-n", "8", "--pass-k", "4", "--T", "64", "--wait", "--interval", "0.01", "--out", str(out)]
    assert main(argv) == Exit.ok
    assert fake.posted == [("r", {"datasets": ["aime", "math"], "samples": 8, "temperature": 1.0, "top_p": 1.0, "pass_k": 4, "context_length": 64})]
    text = capsys.readouterr().out
    assert "run r, policy version 7, T=64 (eval 4):" in text and "avg@8 0.250" in text and "pass@4 0.500" in text
    assert json.loads(out.read_text()) == {"mode": "run", "run": "r", "id": "4", "status": "done", "policy_version": 7, "context_length": 64, "figures": FIGURES}
    # without --wait: the id and how to follow it; a failed eval exits 1 with its reason
    assert main(["eval", "--run", "r", "-d", "aime"]) == Exit.ok
    assert "eval 4 of run r: pending (follow it: magic eval --run r --id 4 --wait)" in capsys.readouterr().out
    monkeypatch.setattr(magic.cli, "ControllerClient", FakeEvals({"status": "failed", "error": "run 'r' ended (stopped) before the eval was served"}))
    assert main(["eval", "--run", "r", "--id", "4", "--wait", "--interval", "0.01"]) == Exit.failed
    assert "ended (stopped) before the eval was served" in capsys.readouterr().err
