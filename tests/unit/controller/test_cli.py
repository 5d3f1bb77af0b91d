"""The CLI's parsing and rendering, and the client's error messages (no controller needed)."""

from magic.cli import build_parser, render_status
from magic.controller.client import ControllerClient, format_detail


def test_stage_flags_use_the_paper_names():
    args = build_parser().parse_args(["stage", "start", "r", "--T", "8192", "--D_R", "64", "--gs", "16", "--tgt-ent", "0.2", "--delta", "0.005"])
    assert (args.stage_T, args.stage_D_R, args.stage_gs, args.stage_tgt_ent, args.stage_Delta) == (8192, 64, 16, 0.2, 0.005)


def test_validation_errors_are_shown_field_by_field():
    text = format_detail([{"loc": ["body", "stages", 0, "D_T"], "msg": "D_R = 8 is not divisible by D_T = 3"}])
    assert text == "  stages.0.D_T: D_R = 8 is not divisible by D_T = 3"


def test_unreachable_controller_is_explained(monkeypatch):
    import pytest

    from magic.controller.client import ClientError
    from magic.local.redis_server import free_port

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
    }
    text = render_status(view)
    assert "run r: running" in text and "stage 1 'long'  T=96" in text and "rollout 1, reward 0, learner 1" in text
    assert "filtered prompts: online 2" in text and "ended at step 2 (steps)" in text and "reward_mean 0.500" in text
