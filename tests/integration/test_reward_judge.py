"""The optional LLM judge against a real vLLM server (the CPU build): asked only about math answers
the rules reject, its "True" turns them correct, and a judge that fails or cannot decide leaves the
rules' verdict.

The judge's model here is a tiny Qwen2 made to answer "True" to everything (every input token has
the same embedding, so the last hidden state is one vector, and the output head points it at the
"True" token): the worst judge there is, which shows exactly which answers a judge is asked about.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_venv import VLLM_PYTHON, require_vllm

from magic.observability.metrics import REWARD_JUDGE
from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import RewardSettings
from magic.protocol.verdict import Status
from magic.rollout.vllm_server import VllmServer, VllmServerConfig
from magic.runtime.ports import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def yes_model_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from magic.demo.prepare import build_tokenizer

    out = tmp_path_factory.mktemp("judge-model")
    build_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    tokenizer.add_tokens(["True", "False"])
    tokenizer.save_pretrained(str(out))
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config).eval()
    true_id = tokenizer.convert_tokens_to_ids("True")
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed.copy_(embed[:1].expand_as(embed))  # one embedding for every token
        h = model.model(input_ids=torch.tensor([[5, 9, 11]])).last_hidden_state[0, -1]
        model.lm_head.weight.zero_()
        model.lm_head.weight[true_id] = h / h.norm() * 50
        assert model(input_ids=torch.tensor([[3, 1, 4, 1, 5]])).logits[0, -1].argmax().item() == true_id
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def judge_server(yes_model_dir, tmp_path_factory):
    require_vllm()
    config = VllmServerConfig(model=str(yes_model_dir), python=VLLM_PYTHON, max_model_len=4096)
    srv = VllmServer(config, tmp_path_factory.mktemp("judge-log") / "server.log").start(timeout=900)
    yield srv
    srv.stop()


def scorer(url: str, model: str) -> Scorer:
    settings = RewardSettings(math={"workers": 1, "judge": {"enabled": True, "url": url, "model": model, "timeout_seconds": 60}})
    return Scorer(settings)


def judged(outcome: str) -> float:
    return REWARD_JUDGE.labels(outcome=outcome)._value.get()  # noqa: SLF001


def test_the_judge_is_asked_only_about_answers_the_rules_reject(judge_server, yes_model_dir):
    with scorer(judge_server.url, str(yes_model_dir)) as s:
        before = judged("accepted")
        wrong = s.verdict(Sample("math", "So the answer is \\boxed{5}.", "7", problem="What is 3 + 4?"))[1]
        assert wrong.status is Status.correct and "LLM judge accepted" in wrong.details, wrong  # the worst judge says yes
        assert judged("accepted") == before + 1
        right = s.verdict(Sample("math", "So the answer is \\boxed{7}.", "7"))[1]
        none = s.verdict(Sample("math", "<think>still working", "7"))[1]
        assert right.status is Status.correct and "LLM judge" not in right.details
        assert none.status is Status.no_answer  # nothing to ask about
        assert judged("accepted") == before + 1


def test_a_judge_that_fails_leaves_the_rules_verdict(yes_model_dir):
    with scorer(f"http://127.0.0.1:{free_port()}", str(yes_model_dir)) as s:
        before = judged("failed")
        v = s.verdict(Sample("math", "So the answer is \\boxed{5}.", "7"))[1]
        assert v.status is Status.wrong and judged("failed") == before + 1


def test_the_judge_needs_a_server_and_is_off_by_default():
    assert RewardSettings().math.judge.enabled is False
    with pytest.raises(ValueError, match="needs a url and a model"):
        RewardSettings(math={"judge": {"enabled": True}})
