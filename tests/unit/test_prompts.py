"""One prompt renderer: the rollout engine, the controller's length check and the warm start count the same tokens."""

import pytest

from magic.prompts import load_tokenizer, render_prompt


def test_the_rollout_engine_and_the_controller_render_the_same_prompt_ids(tiny_model_dir):
    from magic.controller.api.checks import model_limits
    from magic.controller.datasets import PromptRecord
    from magic.rollout.engine import TorchEngine

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 3+5+2+7+9"}]
    ids = TorchEngine(str(tiny_model_dir)).render_prompt(messages)
    tok = load_tokenizer(tiny_model_dir)
    assert ids == render_prompt(tok, messages) and tok.decode(ids).endswith("assistant\n")
    record = PromptRecord(uid="d:0", messages=tuple((m["role"], m["content"]) for m in messages), data_source="x", ground_truth="1")
    assert model_limits(str(tiny_model_dir), [record])[1] == len(ids)


def test_a_tokenizer_without_a_chat_template_is_refused(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(tok, [{"role": "user", "content": "hi"}])
