"""DeepSeek-V3's router (runtime/models/aux_free.py) against a hand-written reference of
arXiv 2412.19437 §2.1.2 (selection by s + b within the best groups, gates from s normalised
and scaled) and of the bias update, with a planted wrong sign that the update check catches;
the bias is a zero-initialised, checkpointed buffer without a gradient, counted once per
forward under activation recomputation."""

from __future__ import annotations

import math

import pytest
import torch

from autoplan.model_spec import load_model
from autoplan.runtime.models.aux_free import ExpertBias, sigmoid_route, update_expert_biases
from autoplan.runtime.models.moe import MoE


def reference_route(logits: list[list[float]], bias: list[float], k: int, groups: int,
                    per_token: int, scale: float) -> tuple[list[list[int]], list[list[float]]]:
    """Plain-Python DeepSeek-V3 routing of each token (row of logits); ties to the lower index."""
    chosen, gates = [], []
    e = len(bias)
    size = e // groups
    for row in logits:
        s = [1.0 / (1.0 + math.exp(-x)) for x in row]
        biased = [s[i] + bias[i] for i in range(e)]
        score = [sum(sorted(biased[g * size:(g + 1) * size], reverse=True)[:2])
                 for g in range(groups)]
        best = sorted(range(groups), key=lambda g: (-score[g], g))[:per_token]
        allowed = [i for i in range(e) if i // size in best]
        top = sorted(allowed, key=lambda i: (-biased[i], i))[:k]
        total = sum(s[i] for i in top)
        chosen.append(top)
        gates.append([s[i] / total * scale for i in top])
    return chosen, gates


@pytest.mark.parametrize(("e", "k", "groups", "per_token", "scale"), [
    (8, 2, 4, 2, 2.5),    # tiny-deepseek
    (16, 4, 8, 2, 1.0),   # two of eight groups of two
    (12, 3, 1, 1, 1.5),   # no group limit
    (32, 8, 8, 4, 2.5),   # DeepSeek-V3's 8 of 4 groups at 1/8 the experts
])
def test_routing_matches_the_reference(e, k, groups, per_token, scale):
    gen = torch.Generator().manual_seed(e * 100 + k)
    logits = torch.randn(40, e, generator=gen, dtype=torch.float64)
    bias = (torch.randn(e, generator=gen, dtype=torch.float64) * 0.3).float()
    gates, chosen = sigmoid_route(logits.float(), bias, k, groups, per_token, scale)
    want_chosen, want_gates = reference_route(logits.float().tolist(), bias.tolist(), k,
                                              groups, per_token, scale)
    assert chosen.tolist() == want_chosen
    assert gates.dtype == torch.float32
    assert torch.allclose(gates, torch.tensor(want_gates), rtol=1e-6, atol=0)
    assert torch.allclose(gates.sum(-1), torch.full((40,), scale), rtol=1e-6)


def test_bias_steers_the_choice_but_not_the_gate():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])  # expert 3 has the lowest score
    gates, chosen = sigmoid_route(logits, bias, 2, 1, 1, 1.0)
    assert chosen.tolist() == [[3, 0]]
    s = torch.sigmoid(logits[0])
    assert torch.allclose(gates[0], torch.stack([s[3], s[0]]) / (s[3] + s[0]))


def test_group_limit_masks_the_other_groups():
    """The best two experts overall sit in different groups; with one group per token both
    come from the group of the highest top-2 sum."""
    logits = torch.tensor([[3.0, -3.0, 2.0, 1.9]])  # groups {0,1}: s sum 1.00; {2,3}: 1.75
    _, chosen = sigmoid_route(logits, torch.zeros(4), 2, 2, 1, 1.0)
    assert chosen.tolist() == [[2, 3]]
    _, free = sigmoid_route(logits, torch.zeros(4), 2, 1, 1, 1.0)
    assert free.tolist() == [[0, 2]]


def reference_update(bias: list[float], load: list[int], rate: float) -> list[float]:
    """b_i + rate * sign(mean - load_i) (§2.1.2)."""
    mean = sum(load) / len(load)
    return [b + rate * ((mean > n) - (mean < n)) for b, n in zip(bias, load, strict=True)]


def _update_problems(update) -> list[str]:
    """Where `update(module, load)` departs from reference_update on a few loads."""
    problems = []
    for load in ([5, 1, 3, 3], [0, 0, 12, 0], [2, 2, 2, 2], [7, 0, 1, 0]):
        m = ExpertBias(4, 0.01)
        m.bias.copy_(torch.tensor([0.1, -0.2, 0.0, 0.05]))
        want = reference_update(m.bias.tolist(), load, 0.01)
        update(m, torch.tensor(load))
        if not torch.allclose(m.bias, torch.tensor(want), rtol=0, atol=1e-7):
            problems.append(f"load {load}: {m.bias.tolist()} vs {want}")
    return problems


def test_bias_update_matches_the_reference_and_a_wrong_sign_is_caught():
    assert not _update_problems(ExpertBias.apply_update)

    def wrong_sign(m: ExpertBias, load: torch.Tensor) -> None:  # planted: the busy go up
        m.bias.add_(torch.sign(load.numel() * load - load.sum()).float(), alpha=m.rate)

    assert _update_problems(wrong_sign)


def _moe(name: str = "tiny-deepseek") -> MoE:
    torch.manual_seed(0)
    moe = MoE(load_model(name))
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return moe


def test_bias_is_a_buffer_without_gradient_and_the_router_gets_one():
    moe = _moe()
    names = dict(moe.named_buffers())
    assert set(names) == {"balance.bias"} and names["balance.bias"].dtype == torch.float32
    assert "balance.bias" in moe.state_dict()
    assert all("balance" not in n for n, _ in moe.named_parameters())
    moe(torch.randn(2, 8, 64)).sum().backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    assert moe.balance.step_load(None).sum() == 2 * 8 * 2  # tokens x top-2


def test_load_counted_once_under_recompute_and_the_update_balances_it():
    moe = _moe()
    x = torch.randn(4, 16, 64, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(moe, x, use_reentrant=False)
    out.sum().backward()  # re-runs the forward inside backward
    assert len(moe.balance.loads) == 1
    load = moe.balance.loads[0].clone()
    assert load.sum() == 4 * 16 * 2
    update_expert_biases([moe], mesh=None, micro_batches=1)
    mean = load.float().mean()
    want = torch.sign(mean - load.float()) * 0.01
    assert torch.equal(moe.balance.bias, want) and not moe.balance.loads


def test_a_step_counts_its_last_micro_batches_only():
    """A forward before the step's micro-batches (the pipeline's metadata inference) is not
    counted: the bias moves as for the two micro-batches alone."""
    moe, twin = _moe(), _moe()
    x = [torch.randn(1, 16, 64) for _ in range(3)]
    for t in x:
        moe(t)
    for t in x[1:]:
        twin(t)
    update_expert_biases([moe], mesh=None, micro_batches=2)
    update_expert_biases([twin], mesh=None)
    assert moe.balance.bias.any() and torch.equal(moe.balance.bias, twin.balance.bias)


def test_evaluation_is_not_counted():
    moe = _moe()
    with torch.no_grad():
        moe(torch.randn(1, 8, 64))
    moe.eval()
    moe(torch.randn(1, 8, 64))
    assert not moe.balance.loads


def test_a_skipped_step_forgets_its_load():
    moe = _moe()
    moe(torch.randn(1, 8, 64))
    update_expert_biases([moe], mesh=None, skipped=True)
    assert not moe.balance.loads and not moe.balance.bias.any()


def test_the_initialiser_zeroes_the_bias():
    from autoplan.runtime.models.init import materialize_and_init
    from autoplan.runtime.models.transformer import build_meta_model

    spec = load_model("tiny-deepseek")
    model = build_meta_model(spec)
    materialize_and_init(model, torch.device("cpu"), spec.num_layers, seed=0)
    biases = {k: v for k, v in model.state_dict().items() if k.endswith("balance.bias")}
    assert len(biases) == spec.moe.moe_layers(spec.num_layers) == 3
    assert all(not v.any() for v in biases.values())


def test_softmax_router_is_unchanged_without_aux_free():
    moe = _moe("tiny-moe")
    assert moe.balance is None and not dict(moe.named_buffers())
    tokens = torch.randn(10, 64)
    gates, chosen = moe.route(tokens, 10)
    logits = moe.router(tokens)
    top = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :2]
    assert torch.equal(chosen, top)
    assert torch.equal(gates, torch.softmax(logits.gather(-1, top), dim=-1))
