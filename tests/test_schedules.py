"""The learning-rate schedules follow their formulas, step by step, and refuse what they cannot do."""

import math

import pytest
import torch

from lit_transformer.engine.schedules import (
    build_schedule,
    noam,
    warmup_constant,
    warmup_cosine,
    warmup_note,
    warmup_stable_decay,
)


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
    with pytest.raises(ValueError, match="noam.*wsd"):
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


# ---- warmup-stable-decay ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_corners_warmup_end_flat_decay_start_and_end(shape):
    """100 steps, warmup 10, decay over the last 40%: linear warmup to the peak at step 9, the peak held until the
    decay starts at step 60, then down to min_ratio at step 100 (linearly, or as 1 - sqrt(progress)), flat after."""
    lrs = _lrs("wsd", 110, base_lr=1.0, warmup_steps=10, total_steps=100, min_lr_ratio=0.1,
               decay_fraction=0.4, decay_shape=shape)  # fmt: skip
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10:61] == pytest.approx([1.0] * 51)  # stable, up to and including the decay's first step
    assert all(a > b for a, b in zip(lrs[60:100], lrs[61:101]))
    assert lrs[100] == pytest.approx(0.1) and lrs[109] == pytest.approx(0.1)
    # A quarter of the decay left 3/4 (linear) or 1 - sqrt(1/4) = 1/2 (1-sqrt) of the way; half of it, 1/2 or 0.29.
    assert lrs[70] == pytest.approx(0.1 + 0.9 * {"linear": 0.75, "1-sqrt": 0.5}[shape])
    assert lrs[80] == pytest.approx(0.1 + 0.9 * (0.5 if shape == "linear" else 1 - math.sqrt(0.5)))


def test_wsd_1_sqrt_falls_faster_at_first_than_linear():
    kwargs = dict(warmup=0, total=100, decay_fraction=0.5, min_ratio=0.0)
    assert warmup_stable_decay(60, shape="1-sqrt", **kwargs) < warmup_stable_decay(60, shape="linear", **kwargs)
    assert warmup_stable_decay(100, shape="1-sqrt", **kwargs) == warmup_stable_decay(100, shape="linear", **kwargs) == 0


def test_wsd_without_warmup_starts_at_the_peak_and_a_whole_run_decay_starts_after_warmup():
    assert warmup_stable_decay(0, warmup=0, total=10, decay_fraction=0.2, shape="linear", min_ratio=0.0) == 1.0
    # decay_fraction 1: the decay starts where warmup ends, not before (no jump down at the end of warmup)
    lrs = [
        warmup_stable_decay(s, warmup=5, total=25, decay_fraction=1.0, shape="linear", min_ratio=0.0) for s in range(26)
    ]
    assert lrs[4] == 1.0 == lrs[5] and lrs[15] == pytest.approx(0.5) and lrs[25] == 0.0


def test_wsd_needs_a_length_and_a_known_shape():
    with pytest.raises(ValueError, match="wsd schedule needs the number of optimizer steps"):
        _lrs("wsd", 1, warmup_steps=1, total_steps=None)
    with pytest.raises(ValueError, match="decay shape 'cosine'"):
        _lrs("wsd", 1, warmup_steps=1, total_steps=10, decay_shape="cosine")


def test_every_parameter_group_follows_the_schedule_from_its_own_rate():
    """Muon's group (muon_lr) and AdamW's (lr) are scaled by the same multiplier."""
    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1e-3},
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.02},
    ]
    optimizer = torch.optim.SGD(groups)
    scheduler = build_schedule(optimizer, "wsd", warmup_steps=2, total_steps=10, decay_fraction=0.5)
    for step in range(10):
        factor = warmup_stable_decay(step, warmup=2, total=10, decay_fraction=0.5, shape="1-sqrt", min_ratio=0.1)
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-3 * factor, 0.02 * factor])
        optimizer.step()
        scheduler.step()


def test_under_noam_muon_reaches_muon_lr_at_the_peak_while_adamw_follows_the_papers_formula():
    """Noam's factor is absolute (d_model^-0.5 * warmup^-0.5 at its peak: 0.0028 at 128 and 4,000), so scaling
    muon_lr by it ran Muon hundreds of times below the peak rate muon_lr is documented to be. Muon's groups follow
    Noam's curve over its peak; AdamW's lr still multiplies the paper's formula."""
    groups = [
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1.0, "optimizer": "adamw"},
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.02, "optimizer": "muon"},
    ]
    optimizer = torch.optim.SGD(groups)
    d_model, warmup = 128, 40
    scheduler = build_schedule(optimizer, "noam", warmup_steps=warmup, d_model=d_model)
    seen = []
    for step in range(2 * warmup):
        adamw, muon = (g["lr"] for g in optimizer.param_groups)
        assert adamw == pytest.approx(noam(step, d_model=d_model, warmup=warmup), rel=1e-12)
        assert muon == pytest.approx(0.02 * adamw / (d_model**-0.5 * warmup**-0.5), rel=1e-12)
        seen.append(muon)
        optimizer.step()
        scheduler.step()
    assert max(seen) == pytest.approx(0.02) and seen.index(max(seen)) == warmup - 1


@pytest.mark.parametrize(("name", "warmup", "total", "says"), [
    ("cosine", 100, 50, "never decays"), ("wsd", 30, 30, "never decays"), ("constant", 100, 20, "never reaching"),
    ("noam", 4000, 200, "never reaching"), ("cosine", 10, 50, None),
])  # fmt: skip
def test_a_warmup_as_long_as_the_run_is_noted(name, warmup, total, says):
    """The default 100 warmup steps with --trainer.max_steps 50 kept the rate rising to the last step, without a
    word: the peak lr was never reached and the cosine never decayed."""
    note = warmup_note(name, warmup, total)
    if says is None:
        assert note is None
    else:
        assert says in note and f"warmup_steps={warmup}" in note and f"--model.optim.warmup_steps {total // 10}" in note
