"""The learning-rate schedules follow their formulas, step by step, and refuse what they cannot do."""

import math

import pytest
import torch

from lit_transformer.engine.schedules import build_schedule, noam, warmup_constant, warmup_cosine


def _lrs(name: str, steps: int, base_lr: float = 1.0, **kwargs) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    scheduler = build_schedule(optimizer, name, **kwargs)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_noam_is_the_papers_formula():
    d_model, warmup = 512, 4000
    lrs = _lrs("noam", 8000, warmup_steps=warmup, d_model=d_model)
    for step in (1, 10, 3999, 4000, 4001, 8000):
        expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert lrs[step - 1] == pytest.approx(expected, rel=1e-12)
    peak = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak == warmup
    assert lrs[warmup - 1] == pytest.approx(d_model**-0.5 * warmup**-0.5)


def test_noam_scales_with_base_lr():
    assert _lrs("noam", 5, base_lr=2.0, warmup_steps=10, d_model=64)[-1] == pytest.approx(
        2 * noam(4, d_model=64, warmup=10)
    )


def test_warmup_cosine_shape():
    lrs = _lrs("cosine", 120, base_lr=1e-3, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert lrs[0] == pytest.approx(1e-4)
    assert lrs[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b - 1e-15 for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[110] == pytest.approx(1e-4) and lrs[119] == pytest.approx(1e-4)


def test_constant_with_warmup():
    lrs = _lrs("constant", 20, base_lr=0.5, warmup_steps=4)
    assert lrs[:4] == pytest.approx([0.125, 0.25, 0.375, 0.5])
    assert lrs[4:] == pytest.approx([0.5] * 16)
    assert warmup_constant(0, warmup=0) == 1.0


def test_cosine_needs_a_length():
    with pytest.raises(ValueError, match="max_steps"):
        _lrs("cosine", 1, warmup_steps=1, total_steps=None)


def test_unknown_schedule():
    with pytest.raises(ValueError, match="noam"):
        _lrs("linear", 1, warmup_steps=1)


def test_a_restored_scheduler_continues_on_the_same_curve():
    # A resumed run restores the scheduler's state dict into a fresh scheduler: the curve must continue exactly.
    def make():
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        return optimizer, build_schedule(optimizer, "cosine", warmup_steps=10, total_steps=100)

    optimizer, scheduler = make()
    for _ in range(57):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    expected = [group["lr"] for group in optimizer.param_groups]
    optimizer2, scheduler2 = make()
    scheduler2.load_state_dict(state)
    optimizer2.param_groups[0]["lr"] = scheduler2.get_last_lr()[0]
    assert scheduler2.last_epoch == 57
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(expected[0])
    assert expected[0] == pytest.approx(1e-3 * warmup_cosine(57, warmup=10, total=100, min_ratio=0.1))
