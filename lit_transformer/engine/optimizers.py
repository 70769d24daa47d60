"""The optimizer of a run and its schedule (`model.optim` in the YAML): Adam or AdamW, with weight decay on exactly the
weight matrices of linear layers; or Muon for the hidden matrices with AdamW for the rest, as one optimizer object
(`MuonWithAdamW`); and the learning-rate schedule."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from lit_transformer.engine.schedules import DECAY_SHAPES, SCHEDULES, DecayShape, ScheduleName
from lit_transformer.errors import ConfigError

OptimizerName = Literal["adamw", "adam", "muon"]
MuonAdjustLR = Literal["original", "match_rms_adamw"]


@dataclass
class Optimization:
    """How the weights move: the optimizer and its learning-rate schedule (`--model.optim.lr 1e-3`)."""

    optimizer: OptimizerName = "adamw"
    """adamw (decoupled weight decay, none on biases, norms and embeddings), adam (the paper's), or muon: torch's Muon
    (Jordan et al. 2024) for the hidden matrices (the weights of the attention and feed-forward projections inside
    the blocks) and AdamW (lr, betas, eps, weight_decay) for everything else (embeddings, the output layer even
    untied, norm gains, biases, value_residual's scalars, LoRA adapters). Not with FSDP, DeepSpeed or ModelParallel."""
    lr: float = 3e-4
    """Peak learning rate (of AdamW's part with muon); with schedule=noam, a multiplier of the paper's formula (1.0
    is the paper's)."""
    betas: tuple[float, float] | None = None
    """Adam betas; None uses (0.9, 0.95) for adamw and the paper's (0.9, 0.98) for adam."""
    eps: float | None = None
    """Adam epsilon; None uses 1e-8 for adamw and the paper's 1e-9 for adam."""
    weight_decay: float | None = None
    """AdamW weight decay, on the weight matrices of linear layers only (see weight_decay_groups); None: 0.1. Plain
    adam (the paper's) has none: a weight decay given with it is ignored, with a warning."""
    decay_embeddings: bool = False
    """Decay the token and position tables too (nanoGPT does; off by default)."""
    fused: bool | None = None
    """Use the fused optimizer kernel; None picks fused on CUDA and foreach elsewhere."""
    schedule: ScheduleName = "cosine"
    """noam (the paper's), cosine (warmup + cosine decay), constant (warmup, then flat), wsd (warmup-stable-decay:
    warmup, flat, then a decay over the last decay_fraction of the run; Hägele et al. 2024)."""
    warmup_steps: int = 100
    """Optimizer steps of linear warmup (noam: the paper's warmup_steps, 4000)."""
    schedule_steps: int | None = None
    """Length of the cosine or wsd schedule in optimizer steps; None uses trainer.max_steps (trainer.max_epochs is not
    read: Lightning's estimated_stepping_batches breaks mid-epoch resume, Lightning issue #20550)."""
    min_lr_ratio: float = 0.1
    """Where the cosine and wsd schedules end, as a fraction of lr (the speedrun's cooldown ends at 0.1 too)."""
    decay_fraction: float = 0.2
    """wsd: the decay's share of the run, the last decay_fraction of schedule_steps (20% matches cosine in Hägele et
    al. 2024; the speedrun cooled down over 40% or more)."""
    decay_shape: DecayShape = "1-sqrt"
    """wsd: how the decay falls from lr to min_lr_ratio * lr: linear, or 1-sqrt (1 - sqrt(progress): Hägele et al.'s
    best)."""
    muon_lr: float = 0.02
    """muon: peak learning rate of the hidden matrices (the schedule scales it as it scales lr; under noam, whose
    factor is absolute, by Noam's curve over its peak). torch's convention: a matrix's orthogonalised update (unit
    singular values) is scaled by muon_lr * sqrt(max(1, rows / columns)) with muon_adjust_lr=original (Keller
    Jordan's Muon; 0.02 its default, the speedrun's 0.05). A fused weight (attention's query-key-value, a gated
    MLP's two halves) is orthogonalised as one matrix, where Keller Jordan's code splits the query-key-value."""
    muon_momentum: float = 0.95
    """muon: momentum of the hidden matrices' updates (after the warm-up below)."""
    muon_nesterov: bool = True
    """muon: Nesterov momentum: orthogonalise the gradient moved toward the momentum buffer (a look ahead), not the
    buffer alone."""
    muon_ns_steps: int = 5
    """muon: Newton-Schulz iterations that orthogonalise each update (each costs three matmuls of the matrix's size;
    fewer steps: a cheaper, rougher orthogonalisation)."""
    muon_weight_decay: float = 0.0
    """muon: decoupled weight decay of the hidden matrices, p <- p * (1 - muon_lr * muon_weight_decay) each step (the
    speedrun's 0; torch's default 0.1 pairs with muon_adjust_lr=match_rms_adamw)."""
    muon_adjust_lr: MuonAdjustLR = "original"
    """muon: torch's adjust_lr_fn. original: muon_lr * sqrt(max(1, rows / columns)) (Keller Jordan's);
    match_rms_adamw: muon_lr * 0.2 * sqrt(max(rows, columns)) (Moonshot's: updates of AdamW's size, so muon_lr and
    muon_weight_decay take AdamW's values)."""
    muon_momentum_warmup_steps: int = 300
    """muon: steps over which the momentum rises linearly from muon_momentum_start to muon_momentum (the speedrun's
    300); 0: muon_momentum from the start."""
    muon_momentum_start: float = 0.85
    """muon: the momentum at the first step of the warm-up (the speedrun's 0.85)."""

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ConfigError("Invalid model.optim:\n  - " + "\n  - ".join(problems))

    def _problems(self):
        for name, allowed in (
            ("optimizer", ("adamw", "adam", "muon")),
            ("schedule", SCHEDULES),
            ("decay_shape", DECAY_SHAPES),
            ("muon_adjust_lr", ("original", "match_rms_adamw")),
        ):
            if getattr(self, name) not in allowed:
                yield f"model.optim.{name}={getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}"
        if not 0.0 < self.decay_fraction <= 1.0:
            yield f"model.optim.decay_fraction={self.decay_fraction} must lie in (0, 1]: the decay's share of the run"
        for name in ("lr", "muon_lr"):
            if getattr(self, name) < 0:
                yield f"model.optim.{name}={getattr(self, name)} must be >= 0"
        for name in ("muon_momentum", "muon_momentum_start"):
            if not 0.0 <= getattr(self, name) < 1.0:
                yield f"model.optim.{name}={getattr(self, name)} must lie in [0, 1)"
        if self.muon_ns_steps < 1:
            yield f"model.optim.muon_ns_steps={self.muon_ns_steps} must be at least 1"
        if self.muon_weight_decay < 0 or self.muon_momentum_warmup_steps < 0:
            yield "model.optim.muon_weight_decay and muon_momentum_warmup_steps must be >= 0"
        for name in ("eps", "weight_decay"):  # torch's Adam refused a negative one only once the run had started
            if getattr(self, name) is not None and getattr(self, name) < 0:
                yield f"model.optim.{name}={getattr(self, name)} must be >= 0 (or null: the optimizer's default)"
        if self.eps == 0:  # the builders read eps=0 as "not given" (the default), and Adam's 0 / 0 would be NaN
            yield (
                "model.optim.eps=0 divides 0 by 0 wherever a gradient entry and its running square are 0 (an "
                "embedding row the batch lacks), turning those weights NaN at the first step: give a small positive "
                "eps (1e-8 is AdamW's, 1e-9 the paper's) or null for the optimizer's default"
            )
        if self.betas is not None and not all(0.0 <= beta < 1.0 for beta in self.betas):
            yield f"model.optim.betas={list(self.betas)} must each lie in [0, 1)"
        if self.warmup_steps < 0:
            yield f"model.optim.warmup_steps={self.warmup_steps} must be >= 0"
        if self.schedule_steps is not None and self.schedule_steps < 1:
            yield f"model.optim.schedule_steps={self.schedule_steps} must be at least 1 (or null: trainer.max_steps)"
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            yield f"model.optim.min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]: the final lr's share of lr"

    @classmethod
    def of(cls, value: Optimization | dict | None, **flat: Any) -> Optimization:
        """The Optimization of `value` (an object, its dict as checkpoints record it, or None: the defaults), with
        the fields given flat (LitTransformer's arguments before model.optim) set over it."""
        base = cls(**value) if isinstance(value, dict) else value or cls()
        return dataclasses.replace(base, **flat)


OPTIMIZATION_FIELDS = tuple(field.name for field in dataclasses.fields(Optimization))


def weight_decay_groups(
    model: torch.nn.Module, decay_embeddings: bool = False
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(decayed, not decayed), decided by the role of each tensor, each tensor once.

    Decayed: the weight matrices of Linear layers. Never decayed: biases and norms. Token and position tables
    (``nn.Embedding`` and ``LearnedPositions``, also when the output projection is tied to one) are decayed only with
    ``decay_embeddings`` (nanoGPT decays them; the paper's and GPT-2's Adam applied no decay at all).
    """
    from lit_transformer.model.positions import LearnedPositions

    tables: set[int] = set()
    matrices: set[int] = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, LearnedPositions)):
            tables.add(id(module.weight))
        elif isinstance(module, torch.nn.Linear):
            matrices.add(id(module.weight))
    decayed_ids = (matrices - tables) | (tables if decay_embeddings else set())
    decay, no_decay, seen = [], [], set()
    for param in model.parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        (decay if id(param) in decayed_ids else no_decay).append(param)
    return decay, no_decay


def warn_no_effect_with_adam(optim: Optimization) -> None:
    """Plain Adam has no weight decay: say so once when a run sets one, and how to get it."""
    ignored = [f"weight_decay={optim.weight_decay}"] if optim.weight_decay else []
    ignored += ["decay_embeddings=true"] if optim.decay_embeddings else []
    if ignored:
        warnings.warn(
            f"model.optim.{' and '.join(ignored)} has no effect with optimizer adam (the paper's Adam decays no "
            "weight): set model.optim.optimizer adamw to decay the weights, or model.optim.weight_decay null to "
            "silence this",
            UserWarning,
            stacklevel=3,
        )


def build_optimizer(model: torch.nn.Module, optim: Optimization, fused: bool) -> torch.optim.Optimizer:
    """Adam (the paper's: betas (0.9, 0.98), eps 1e-9 unless given, no decay) or AdamW (betas (0.9, 0.95), eps 1e-8,
    decay on weight_decay_groups' first group), fused or foreach; or Muon with AdamW (build_muon)."""
    if optim.optimizer == "muon":
        return build_muon(model, optim, fused)
    decay, no_decay = weight_decay_groups(model, optim.decay_embeddings)
    adam = optim.optimizer == "adam"
    if adam:
        warn_no_effect_with_adam(optim)
    betas = optim.betas or ((0.9, 0.98) if adam else (0.9, 0.95))
    kwargs: dict[str, Any] = {"lr": optim.lr, "betas": tuple(betas), "eps": optim.eps or (1e-9 if adam else 1e-8)}
    kwargs["fused" if fused else "foreach"] = True
    if adam:
        return torch.optim.Adam(decay + no_decay, **kwargs)
    weight_decay = 0.1 if optim.weight_decay is None else optim.weight_decay
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, **kwargs)


# ---- Muon + AdamW -------------------------------------------------------------------------------------------------


def muon_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The hidden matrices Muon moves, by role: the weights of the Linear layers inside the Transformer's blocks
    (self- and cross-attention's projections, the feed-forward's up and down), which train. Not by shape: the
    embeddings and the output layer are 2-D too, and stay with AdamW (Muon is for hidden layers: Jordan et al.), as do
    a classifier's head, a features or patches input projection, norms, biases, scalars and LoRA's adapters (low-rank
    factors, not whole matrices; peft names them lora_A and lora_B)."""
    from lit_transformer.model.blocks import BLOCK_CLASSES

    hidden: dict[int, torch.nn.Parameter] = {}
    for block in (m for m in model.modules() if isinstance(m, BLOCK_CLASSES)):
        for name, module in block.named_modules():
            if isinstance(module, torch.nn.Linear) and "lora_" not in name and module.weight.requires_grad:
                hidden.setdefault(id(module.weight), module.weight)
    names = {id(p): name for name, p in model.named_parameters()}
    for p in hidden.values():
        if p.ndim != 2:  # a sharded strategy's flat piece: no matrix to orthogonalise (never 1-D into Muon)
            raise ConfigError(
                f"model.optim.optimizer=muon needs whole 2-D weight matrices, but {names.get(id(p), 'a block weight')} "
                f"is {tuple(p.shape)} here (a sharding strategy flattens parameters): use ddp, or optimizer adamw"
            )
    return list(hidden.values())


def muon_momentum_at(step: int, *, target: float, start: float, warmup: int) -> float:
    """The momentum at step `step` (0-based): from `start` linearly to `target` over `warmup` steps, then `target`."""
    if warmup <= 0:
        return target
    fraction = min(1.0, step / warmup)
    return (1.0 - fraction) * start + fraction * target


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon for the hidden matrices and torch.optim.AdamW for every other parameter, as ONE optimizer:
    Lightning's automatic optimization takes one, and the schedule, clipping, the non-finite guard, the token
    normalisation and checkpoints then see all parameters through it.

    Its param_groups are AdamW's groups followed by Muon's (each group's own "lr": the schedule scales AdamW's lr and
    Muon's muon_lr by the same factor; a group's "optimizer" key says whose it is, its "name" what the learning-rate
    logger calls it), the same dicts the two inner optimizers read, and one state for both: state_dict and
    load_state_dict hold both parts (an exact resume), and zero_grad reaches every group. step(closure) runs the
    closure once, then AdamW's step and Muon's.

    Muon's momentum warm-up is kept in its group ("momentum" is set before each step from "steps_taken", counted in
    the group and so saved with it; a step skipped by the non-finite guard still counts, as the schedule's does).
    `defaults["fused"]` is False whatever AdamW's part runs: this optimizer honours no found_inf flag and does not
    unscale fp16 gradients itself, so the guard reads its verdict on the host and a GradScaler unscales first.
    """

    def __init__(
        self,
        adamw_groups: list[dict[str, Any]],
        muon_params: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        fused: bool,
        muon_lr: float,
        muon_momentum: float = 0.95,
        muon_nesterov: bool = True,
        muon_ns_steps: int = 5,
        muon_weight_decay: float = 0.0,
        muon_adjust_lr: str = "original",
        momentum_warmup_steps: int = 0,
        momentum_start: float = 0.85,
    ) -> None:
        kind = {"fused": True} if fused else {"foreach": True}
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps, **kind)
        # One group even when empty (LoRA trains no hidden matrix): the same groups in every run, so checkpoints match.
        self.muon = torch.optim.Muon(
            [{"params": list(muon_params)}],
            lr=muon_lr,
            weight_decay=muon_weight_decay,
            momentum=muon_momentum,
            nesterov=muon_nesterov,
            ns_steps=muon_ns_steps,
            adjust_lr_fn=muon_adjust_lr,
        )
        for group in self.adamw.param_groups:
            group["optimizer"] = "adamw"
        for group in self.muon.param_groups:
            group.update(
                optimizer="muon",
                name="muon",  # the learning-rate logger's name for the group: lr-MuonWithAdamW/muon
                momentum_target=muon_momentum,
                momentum_start=momentum_start,
                momentum_warmup_steps=momentum_warmup_steps,
                steps_taken=0,
            )
        self._adamw_groups = len(self.adamw.param_groups)
        # The inner optimizers' own group dicts become this optimizer's (torch checks no parameter is in two).
        super().__init__([*self.adamw.param_groups, *self.muon.param_groups], {})
        self.defaults = {
            **self.adamw.defaults,
            "fused": False,
            "foreach": None,
            "muon_lr": muon_lr,
            "muon": dict(self.muon.defaults),
        }
        self._share()

    def _share(self) -> None:
        """Point the inner optimizers at this optimizer's groups and state (load_state_dict makes new ones)."""
        self.adamw.param_groups = self.param_groups[: self._adamw_groups]
        self.muon.param_groups = self.param_groups[self._adamw_groups :]
        self.adamw.state = self.muon.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.muon.param_groups:
            group["momentum"] = muon_momentum_at(
                group["steps_taken"],
                target=group["momentum_target"],
                start=group["momentum_start"],
                warmup=group["momentum_warmup_steps"],
            )
            group["steps_taken"] += 1
        self.adamw.step()
        self.muon.step()
        return loss


def build_muon(model: torch.nn.Module, optim: Optimization, fused: bool) -> MuonWithAdamW:
    """MuonWithAdamW over `model`: muon_parameters to Muon; the rest to AdamW in weight_decay_groups' two groups (a
    Linear weight outside the blocks, such as an untied output layer, decayed; tables only with decay_embeddings)."""
    hidden = muon_parameters(model)
    hidden_ids = {id(p) for p in hidden}
    decay, no_decay = weight_decay_groups(model, optim.decay_embeddings)
    weight_decay = 0.1 if optim.weight_decay is None else optim.weight_decay
    groups = [
        {"params": [p for p in decay if id(p) not in hidden_ids], "weight_decay": weight_decay, "name": "adamw_decay"},
        {"params": [p for p in no_decay if id(p) not in hidden_ids], "weight_decay": 0.0, "name": "adamw_no_decay"},
    ]
    return MuonWithAdamW(
        groups,
        hidden,
        lr=optim.lr,
        betas=tuple(optim.betas or (0.9, 0.95)),
        eps=optim.eps or 1e-8,
        fused=fused,
        muon_lr=optim.muon_lr,
        muon_momentum=optim.muon_momentum,
        muon_nesterov=optim.muon_nesterov,
        muon_ns_steps=optim.muon_ns_steps,
        muon_weight_decay=optim.muon_weight_decay,
        muon_adjust_lr=optim.muon_adjust_lr,
        momentum_warmup_steps=optim.muon_momentum_warmup_steps,
        momentum_start=optim.muon_momentum_start,
    )


# Strategies that hand the optimizer sharded parameters (a flat piece of each matrix per rank).
_SHARDING_STRATEGIES = ("fsdp", "deepspeed", "modelparallel", "model_parallel")


def check_optimizer_precision(optimizer: str, eps: float | None, precision: Any) -> None:
    """Refuse, before training, `trainer.precision 16-true` with an Adam eps that is 0 in fp16. 16-true keeps the
    weights and the optimizer's state in fp16, where eps below 2**-25 rounds to 0 (AdamW's 1e-8, the paper's 1e-9):
    the first step divides 0 by 0 wherever a gradient entry and its running square are 0 (the embedding of a token
    the batch lacks), and every weight turned NaN at step 1 (the tiny preset, measured). bf16 keeps fp32's exponent
    range, and the mixed precisions keep fp32 weights and state, so only 16-true is judged."""
    if str(precision) != "16-true":
        return
    value = eps if eps is not None else (1e-9 if optimizer == "adam" else 1e-8)
    if float(torch.tensor(value, dtype=torch.float16)) == 0.0:
        raise ConfigError(
            f"trainer.precision=16-true keeps the optimizer's state in fp16, where Adam's eps={value:g} is 0: the "
            "first step divides by zero and the weights turn NaN. Give --model.optim.eps 1e-4 (or larger), or train "
            "in bf16-true, bf16-mixed or 16-mixed",
            keys=["trainer.precision", "model.optim.eps"],
        )


def check_optimizer_strategy(optim: Optimization, strategy: Any) -> None:
    """Refuse, before training, a strategy the optimizer cannot run under: Muon orthogonalises whole matrices, and
    FSDP, DeepSpeed (ZeRO) and ModelParallel give each rank flat or sharded pieces of them."""
    if optim.optimizer != "muon":
        return
    name = strategy if isinstance(strategy, str) else getattr(strategy, "class_path", None) or type(strategy).__name__
    if any(part in str(name).lower().replace(".", "") for part in _SHARDING_STRATEGIES):
        raise ConfigError(
            f"model.optim.optimizer=muon orthogonalises whole weight matrices, but trainer.strategy={name!r} shards "
            "them across ranks: use --trainer.strategy ddp (or auto), or --model.optim.optimizer adamw with it"
        )
