"""The chunked log-prob / entropy computation equals the naive one, values and gradients."""

import math

import pytest
import torch

from magic import modeling


def test_entropy_and_logprob_hand_computed_at_a_temperature():
    head = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    hidden = torch.tensor([[[0.0, math.log(3.0)]]])  # logits [0, ln 3]
    logp, ent = modeling.logp_entropy_from_hidden(head, hidden, torch.tensor([[1]]), temperature=1.0)
    assert logp.item() == pytest.approx(math.log(0.75), rel=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rel=1e-6)
    # tau = 2: logits [0, ln 3 / 2] -> p proportional to [1, sqrt 3]
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    logp, ent = modeling.logp_entropy_from_hidden(head, hidden, torch.tensor([[1]]), temperature=2.0)
    assert logp.item() == pytest.approx(math.log(p1), rel=1e-6)
    assert ent.item() == pytest.approx(-(p1 * math.log(p1) + (1 - p1) * math.log(1 - p1)), rel=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_chunked_equals_naive_values_and_gradients(chunk, tau):
    torch.manual_seed(0)
    b, l, h, v = 2, 7, 8, 50
    hidden = torch.randn(b, l, h, dtype=torch.float64, requires_grad=True)
    head = torch.nn.Linear(h, v, bias=False).double()
    targets = torch.randint(0, v, (b, l))
    g1, g2 = torch.randn(b, l, dtype=torch.float64), torch.randn(b, l, dtype=torch.float64)

    logp, ent = modeling.logp_entropy_from_hidden(head, hidden, targets, tau, chunk_size=chunk)
    ((logp * g1).sum() + (ent * g2).sum()).backward()
    got = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    ref_logp, ref_ent = modeling.naive_logp_entropy(hidden, head.weight, targets, tau)
    ((ref_logp * g1).sum() + (ref_ent * g2).sum()).backward()
    assert torch.allclose(logp.double(), ref_logp.double(), atol=1e-5)
    assert torch.allclose(ent.double(), ref_ent.double(), atol=1e-5)
    assert torch.allclose(got[0], hidden.grad, atol=1e-5)
    assert torch.allclose(got[1], head.weight.grad, atol=1e-5)


def test_token_logprobs_through_a_model_match_the_naive_path(tiny_model_dir):
    torch.manual_seed(1)
    model = modeling.load_model(tiny_model_dir)
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    attn = torch.ones_like(ids)
    logp, ent = modeling.token_logprobs(model, ids, attn, 0.8, chunk_size=4)
    (logp.sum() + ent.sum()).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / 0.8
    lp_all = torch.log_softmax(logits, -1)
    ref_logp = lp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ref_ent = -(lp_all.exp() * lp_all).sum(-1)
    (ref_logp.sum() + ref_ent.sum()).backward()
    assert torch.allclose(logp, ref_logp, atol=1e-5)
    assert torch.allclose(ent, ref_ent, atol=1e-5)
    for a, p in zip(got, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-5)


def test_an_output_layer_with_a_bias_is_refused():
    with pytest.raises(ValueError, match="bias"):
        modeling.logp_entropy_from_hidden(torch.nn.Linear(2, 3), torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.long), 1.0)
