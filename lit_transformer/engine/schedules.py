"""Learning-rate schedules as multipliers of the optimizer's base learning rate, stepped every optimizer step.

Each is a pure function of the step, so a resumed run (whose scheduler state restores the step count) continues
on exactly the same curve.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Literal, get_args

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from lit_transformer.errors import ConfigError

ScheduleName = Literal["noam", "cosine", "constant", "wsd"]
DecayShape = Literal["linear", "1-sqrt"]
SCHEDULES: tuple[str, ...] = get_args(ScheduleName)
DECAY_SHAPES: tuple[str, ...] = get_args(DecayShape)


def noam(step: int, *, d_model: int, warmup: int) -> float:
    """Vaswani et al. 2017, eq. 3: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), with steps counted from 1."""
    step = step + 1
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_of_peak(step: int, *, d_model: int, warmup: int) -> float:
    """Noam's curve divided by its peak (at step `warmup`): a multiplier that rises to 1, for a rate given as a peak
    (Muon's muon_lr) beside one that multiplies the paper's absolute formula (lr)."""
    return noam(step, d_model=d_model, warmup=warmup) / noam(warmup - 1, d_model=d_model, warmup=warmup)


def warmup_cosine(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1 over `warmup` steps, then half a cosine down to `min_ratio` at `total`, flat after."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_constant(step: int, *, warmup: int) -> float:
    """Linear warmup to 1 over `warmup` steps, then constant."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def warmup_stable_decay(
    step: int, *, warmup: int, total: int, decay_fraction: float, shape: DecayShape, min_ratio: float
) -> float:
    """Warmup-stable-decay (Hägele et al. 2024; the speedrun's cooldown): linear warmup to 1 over `warmup` steps, 1 until
    the decay starts, round(decay_fraction * total) steps before `total` (not before warmup ends), then down to
    `min_ratio` at `total`, flat after: linearly, or as 1 - sqrt(progress) ("1-sqrt", which falls fast at first)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    start = max(warmup, total - round(decay_fraction * total))
    if step < start:
        return 1.0
    progress = min(1.0, (step - start) / max(1, total - start))
    left = 1.0 - (math.sqrt(progress) if shape == "1-sqrt" else progress)
    return min_ratio + (1.0 - min_ratio) * left


def build_schedule(
    optimizer: Optimizer,
    name: ScheduleName,
    *,
    warmup_steps: int,
    total_steps: int | None = None,
    d_model: int | None = None,
    min_lr_ratio: float = 0.1,
    decay_fraction: float = 0.2,
    decay_shape: DecayShape = "1-sqrt",
) -> LambdaLR:
    """The LambdaLR for a schedule name. With `noam` the base learning rate is a multiplier of the paper's formula.
    The multiplier applies to every parameter group's own base rate (Muon's and AdamW's alike), but for Muon's groups
    under `noam`: they follow Noam's curve over its peak, so muon_lr stays Muon's peak rate as documented (the paper's
    absolute factor, 0.0028 at its peak for d_model 128 and 4,000 warmup steps, ran Muon 360 times below it)."""
    if name in ("cosine", "wsd") and (not total_steps or total_steps <= 0):
        raise ConfigError(
            f"The {name} schedule needs the number of optimizer steps: set --trainer.max_steps or "
            "--model.optim.schedule_steps (lit_transformer does not read trainer.estimated_stepping_batches, "
            "which breaks mid-epoch resume: Lightning issue #20550)"
        )
    if name == "noam":
        if d_model is None:
            raise ConfigError("The noam schedule needs d_model")
        fn = partial(noam, d_model=d_model, warmup=max(1, warmup_steps))
        of_peak = partial(noam_of_peak, d_model=d_model, warmup=max(1, warmup_steps))
        groups = optimizer.param_groups
        return LambdaLR(optimizer, [of_peak if group.get("optimizer") == "muon" else fn for group in groups])
    elif name == "cosine":
        fn = partial(warmup_cosine, warmup=max(1, warmup_steps), total=total_steps, min_ratio=min_lr_ratio)
    elif name == "constant":
        fn = partial(warmup_constant, warmup=warmup_steps)
    elif name == "wsd":
        if decay_shape not in DECAY_SHAPES:
            raise ConfigError(
                f"Unknown decay shape {decay_shape!r}; choose one of {', '.join(map(repr, DECAY_SHAPES))}"
            )
        fn = partial(
            warmup_stable_decay,
            warmup=warmup_steps,
            total=total_steps,
            decay_fraction=decay_fraction,
            shape=decay_shape,
            min_ratio=min_lr_ratio,
        )
    else:
        raise ConfigError(f"Unknown schedule {name!r}; choose one of {', '.join(map(repr, SCHEDULES))}")
    return LambdaLR(optimizer, fn)


def schedule_length(optim: Any, max_steps: int | None) -> int | None:
    """The optimizer steps a cosine or wsd schedule decays over: model.optim.schedule_steps, else trainer.max_steps
    (None where neither is set: build_schedule refuses those two schedules then)."""
    return optim.schedule_steps or (max_steps if max_steps and max_steps > 0 else None)


def warmup_note(name: str, warmup: int, total: int | None) -> str | None:
    """A warmup as long as the run (the default 100 warmup steps with --trainer.max_steps 50) keeps the rate rising to
    the end: it never reaches lr, and a cosine or wsd decay never starts. The note that says so; None otherwise."""
    if not total or total <= 0 or warmup < total:
        return None
    decay = " and never decays" if name in ("cosine", "wsd") else ""
    return (
        f"note: model.optim.warmup_steps={warmup} is not below the {total} optimizer steps the {name} schedule runs: "
        f"the learning rate rises for the whole run, never reaching its peak (at step {warmup}){decay}. A shorter warmup: "
        f"--model.optim.warmup_steps {max(1, total // 10)}"
    )


def schedule_length_note(name: str, old: int | None, new: int | None, step: int, scheduler: Any) -> str | None:
    """A run resumed with another schedule length (a larger max_steps to train on) follows the new schedule from its
    next step: a wsd run's stable phase goes on, a finished cosine decay starts again from a higher rate. The note
    that says so with both rates, and how to keep the earlier schedule; None where the length is the same."""
    if old is None or new is None or old == new or scheduler is None:
        return None
    scheduler = scheduler[0] if isinstance(scheduler, list) else scheduler
    was = scheduler.optimizer.param_groups[0]["lr"]  # as the checkpoint left it: the earlier schedule's
    now = scheduler.base_lrs[0] * scheduler.lr_lambdas[0](step)
    return (
        f"note: the {name} schedule decays over {new} optimizer steps in this run, and decayed over {old} in the run "
        f"resumed: from step {step} the learning rate follows the {new}-step one ({was:.3g} before, {now:.3g} now). "
        f"To go on with the earlier schedule: --model.optim.schedule_steps {old}"
    )


def run_ends_first_note(name: str, total: int | None, steps: float | int | None, epochs: int | None) -> str | None:
    """A cosine or wsd schedule sized by max_steps (or schedule_steps) in a run that max_epochs ends sooner (Lightning
    stops at whichever comes first): the decay is cut short, and the rate never comes down to its minimum. The note
    that says so, with the flag that sizes the schedule to the run; None otherwise."""
    if name not in ("cosine", "wsd") or not total or not isinstance(steps, int) or not 0 < steps < total:
        return None
    return (
        f"note: the {name} schedule decays over {total} optimizer steps, and trainer.max_epochs={epochs} ends the run "
        f"after {steps}: the learning rate stops before the end of its decay. To decay over the run: "
        f"--model.optim.schedule_steps {steps}"
    )
