"""lit_transformer/engine/lightning_compat.py holds every use of Lightning's private API: these tests fail on a Lightning
release it was not checked against, and when a private name it relies on is gone or takes other parameters. The
collective timeout reaches a named strategy through its public `timeout` argument."""

from __future__ import annotations

import ast
import importlib
import inspect
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy, StrategyRegistry

from lit_transformer.engine import lightning_compat
from lit_transformer.engine.lightning_compat import (
    CHECKED_VERSIONS,
    PRIVATE,
    TIMEOUT_ATTRIBUTE,
    LightningCLIHooks,
    collective_timeout,
    set_collective_timeout,
    strategy_with_timeout,
    version_checked,
)

PACKAGE = Path(lightning_compat.__file__).parents[1]


def _resolve(name: str):
    module, _, qualified = name.partition(":")
    value = importlib.import_module(module)
    for part in qualified.split("."):
        value = getattr(value, part)
    return value


def _parameters(function) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def private_name_problems(private: dict[str, tuple[str, ...]]) -> list[str]:
    """Each private name that is missing or whose parameters are not those expected, in words."""
    problems = []
    for name, expected in private.items():
        try:
            found = _parameters(_resolve(name))
        except (ImportError, AttributeError) as error:
            problems.append(f"{name}: gone ({error})")
            continue
        if found != expected:
            problems.append(f"{name}: parameters {found}, expected {expected}")
    return problems


def test_the_installed_lightning_is_a_checked_version():
    assert version_checked(L.__version__), (
        f"lightning {L.__version__} is not one lit_transformer/engine/lightning_compat.py was checked against "
        f"({', '.join(CHECKED_VERSIONS)}): check each name in its PRIVATE and TIMEOUT_ATTRIBUTE on this release "
        "(this file's tests), adapt that module, then add the version to CHECKED_VERSIONS"
    )
    assert version_checked("2.6.0") and version_checked("2.6.11")
    assert not version_checked("2.7.0") and not version_checked("3.0.0") and not version_checked("2.60.1")


def test_every_private_name_exists_with_the_parameters_it_is_called_with():
    assert private_name_problems(PRIVATE) == []


def test_a_renamed_or_changed_private_name_is_caught(monkeypatch):
    """The check itself: a planted change of signature and a missing name are both reported."""
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr(LightningCLI, "_run_subcommand", lambda self, subcommand, extra: None)
    problems = private_name_problems({**PRIVATE, "lightning.pytorch.cli:LightningCLI._gone": ("self",)})
    assert len(problems) == 2
    assert "_run_subcommand: parameters ('self', 'subcommand', 'extra')" in problems[0]
    assert "_gone: gone" in problems[1]


def test_the_strategies_keep_their_timeout_where_the_compat_module_reads_it():
    """DDP and FSDP take a public `timeout` and keep it in TIMEOUT_ATTRIBUTE, which their setup passes on."""
    for strategy_class, starts_group in ((DDPStrategy, "setup_distributed"), (FSDPStrategy, "setup_environment")):
        assert "timeout" in inspect.signature(strategy_class.__init__).parameters
        strategy = strategy_class(timeout=timedelta(seconds=7))
        assert getattr(strategy, TIMEOUT_ATTRIBUTE) == timedelta(seconds=7)
        assert f"self.{TIMEOUT_ATTRIBUTE}" in inspect.getsource(getattr(strategy_class, starts_group))
    entry = StrategyRegistry["ddp"]  # the registry's layout strategy_with_timeout reads
    assert entry["strategy"] is DDPStrategy and isinstance(entry["init_params"], dict)


def test_a_named_strategy_gets_the_timeout_through_its_public_argument():
    timeout = timedelta(seconds=3)
    ddp = strategy_with_timeout("ddp", timeout)
    assert isinstance(ddp, DDPStrategy) and collective_timeout(ddp) == timeout
    spawn = strategy_with_timeout("ddp_spawn", timeout)  # the registry's own arguments are kept
    assert isinstance(spawn, DDPStrategy) and spawn._start_method == "spawn" and collective_timeout(spawn) == timeout
    assert strategy_with_timeout("auto", timeout) == "auto"
    given = DDPStrategy()
    assert strategy_with_timeout(given, timeout) is given
    single = strategy_with_timeout("single_device", timeout)  # no process group, no timeout: unchanged
    assert single == "single_device"


def test_a_strategy_lightning_chose_gets_the_timeout_set():
    timeout = timedelta(seconds=3)
    chosen = DDPStrategy()
    assert collective_timeout(chosen) == timedelta(minutes=30)  # torch's default, which the CLI replaces
    set_collective_timeout(chosen, timeout)
    assert collective_timeout(chosen) == timeout
    single = SingleDeviceStrategy("cpu")
    set_collective_timeout(single, timeout)
    assert collective_timeout(single) is None


def test_the_cli_builds_a_named_strategy_with_the_collective_timeout(tmp_path, monkeypatch):
    """`--trainer.strategy ddp --collective_timeout 7`: the trainer's strategy is built with timeout=7 s."""
    from lit_transformer.cli.lightning_cli import TransformerCLI, _trainer_defaults
    from lit_transformer.engine.lightning_module import LitTransformer

    monkeypatch.chdir(Path(__file__).parents[1])

    class BuildOnly(TransformerCLI):
        def run_subcommand(self, subcommand: str) -> None:
            pass

    args = ["fit", "--config", "configs/presets/tiny.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
            "--trainer.strategy", "ddp", "--collective_timeout", "7", "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    cli = BuildOnly(LitTransformer, L.LightningDataModule, subclass_mode_data=True, args=args,
                    trainer_defaults=_trainer_defaults(), auto_configure_optimizers=False)  # fmt: skip
    assert isinstance(cli, LightningCLIHooks)
    assert isinstance(cli.trainer.strategy, DDPStrategy)
    assert collective_timeout(cli.trainer.strategy) == timedelta(seconds=7)


def test_no_other_module_of_the_package_touches_lightning_private_names():
    """Imports of a private Lightning name, and the private attributes named in PRIVATE, appear in
    lightning_compat.py only."""
    private_attributes = {name.rpartition(".")[2] for name in PRIVATE} | {TIMEOUT_ATTRIBUTE, "_should_accumulate"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "lightning_compat.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
                found += [f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.Attribute) and node.attr in private_attributes:
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Constant) and node.value in private_attributes:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert found == []


@pytest.mark.parametrize("hook", ["build_trainer", "run_subcommand", "parse_checkpoint_hyperparameters"])
def test_the_cli_overrides_public_hooks_only(hook):
    from lit_transformer.cli.lightning_cli import TransformerCLI

    assert hook in vars(TransformerCLI)
    assert not {"_instantiate_trainer", "_run_subcommand", "_parse_ckpt_path"} & set(vars(TransformerCLI))
