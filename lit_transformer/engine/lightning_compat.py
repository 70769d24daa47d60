"""Every use of Lightning's private API, in one place: each behind a function or hook with a public name.

Lightning may rename or change a private name in any release. So this module lists what it relies on (`PRIVATE`,
with the parameters each is called with) and the Lightning versions that list was checked against
(`CHECKED_VERSIONS`); tests/test_lightning_compat.py fails on any other version and on any name that changed. On a new
Lightning release: run that test, adapt what it names here (nowhere else), and add the version.

What stays private, and why:
- LightningCLI's `_instantiate_trainer`, `_run_subcommand` and `_parse_ckpt_path`: the only places to add callbacks
  before the trainer exists, to catch a lost peer around the command, and to read --ckpt_path safely.
  `LightningCLIHooks` overrides them once and calls `build_trainer`, `run_subcommand` and
  `parse_checkpoint_hyperparameters`, which the CLI overrides instead.
- LightningCLI's `_dump_config` (the model's and data's hyperparameters: the parsed config dumped to YAML text, then
  that text loaded back) gets the same data without the text (`config_dump`): about 7% of a tiny command's CPU.
- A strategy's `_timeout` where Lightning chose the strategy (`auto`) or built it from a class path: the public
  `timeout` argument of DDP, FSDP, DeepSpeed and ModelParallel strategies is used wherever the strategy is named.
- `_format_summary_table` (the model summary's table) and `_plugin_to_compute_dtype` (a precision plugin's dtype).
- The logger connector's `update_train_step_metrics`: a callback that ends the run in on_train_batch_end (a
  preemption) logs that step's metrics first, as Lightning would have just after the hook.
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

import jsonargparse
import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import Strategy, StrategyRegistry

CHECKED_VERSIONS = ("2.6",)
"""The Lightning releases (major.minor) whose private names below were checked; see tests/test_lightning_compat.py."""

PRIVATE: dict[str, tuple[str, ...]] = {
    "lightning.pytorch.cli:LightningCLI._instantiate_trainer": ("self", "config", "callbacks"),
    "lightning.pytorch.cli:LightningCLI._run_subcommand": ("self", "subcommand"),
    "lightning.pytorch.cli:LightningCLI._parse_ckpt_path": ("self",),
    "lightning.pytorch.cli:LightningCLI._dump_config": ("self",),
    "lightning.pytorch.utilities.model_summary.model_summary:_format_summary_table": (
        "total_parameters",
        "trainable_parameters",
        "model_size",
        "total_training_modes",
        "total_flops",
        "cols",
    ),  # fmt: skip
    "lightning.pytorch.callbacks.throughput_monitor:_plugin_to_compute_dtype": ("plugin",),
    "lightning.pytorch.trainer.connectors.logger_connector.logger_connector:_LoggerConnector.update_train_step_metrics": (
        "self",
    ),
}
"""Each private callable relied on ("module:qualified name") and the names of its parameters, in order."""

TIMEOUT_ATTRIBUTE = "_timeout"
"""Where a built strategy keeps the `timeout` it was given (DDP, FSDP, DeepSpeed, ModelParallel), read by setup."""


def version_checked(version: str = L.__version__) -> bool:
    """Whether `version` is one of the Lightning releases this module was checked against."""
    return ".".join(version.split(".")[:2]) in CHECKED_VERSIONS


class LightningCLIHooks(LightningCLI):
    """LightningCLI whose private steps call public-named methods: a subclass overrides those (and calls super())."""

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[L.Callback]) -> L.Trainer:
        return self.build_trainer(config, callbacks)

    def _run_subcommand(self, subcommand: str) -> None:
        self.run_subcommand(subcommand)

    def _parse_ckpt_path(self) -> None:
        self.parse_checkpoint_hyperparameters()

    def _dump_config(self) -> None:
        """Lightning's: `config_dump = yaml.safe_load(parser.dump(config, skip_link_targets=False, skip_none=False,
        format="yaml"))`, its subcommand's part. The dump's plain data (jsonargparse's public `set_dumper`: a format
        that returns it as it is) is what that YAML text loads back as (`yaml_round_trip`): emitting the text and
        parsing it again in pure-Python PyYAML was half of the dump's time. Data YAML might read back otherwise takes
        Lightning's way."""
        if hasattr(self, "config_dump"):
            return
        kwargs = {"skip_link_targets": False, "skip_none": False}
        try:
            self.config_dump = yaml_round_trip(self.parser.dump(self.config, **kwargs, format=PLAIN_DUMP_FORMAT))
        except NotPlainData:
            import yaml

            self.config_dump = yaml.safe_load(self.parser.dump(self.config, **kwargs, format="yaml"))
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def build_trainer(self, config: dict[str, Any], callbacks: list[L.Callback]) -> L.Trainer:
        """The trainer from its arguments (`config`) and the callbacks the parser built (`callbacks`)."""
        return super()._instantiate_trainer(config, callbacks)

    def run_subcommand(self, subcommand: str) -> None:
        """Run fit, validate, test or predict with the objects built."""
        super()._run_subcommand(subcommand)

    def parse_checkpoint_hyperparameters(self) -> None:
        """Update self.config with the model hyperparameters saved in the subcommand's --ckpt_path, if one is given."""
        super()._parse_ckpt_path()


PLAIN_DUMP_FORMAT = "lit_transformer_plain"
"""A jsonargparse dump format (`set_dumper`) that returns the dump's data as it is, not as text."""
jsonargparse.set_dumper(PLAIN_DUMP_FORMAT, lambda data: data)


class NotPlainData(ValueError):
    """Data whose YAML round trip yaml_round_trip does not vouch for."""


def yaml_round_trip(data: Any) -> Any:
    """What `yaml.safe_load(yaml.safe_dump(data, default_flow_style=False, allow_unicode=True, sort_keys=False))`
    gives (jsonargparse's YAML dump, loaded back), made without the text: a copy of dicts with string keys, lists,
    printable strings, ints, floats, bools and None, each of which YAML writes and reads back as the same value of
    the same type. NotPlainData for anything else (a tuple, a subclass of those types, a string with a tab or a line
    separator, a container met twice, which YAML writes as an alias and reads back as one shared object)."""
    seen: set[int] = set()

    def copy(value: Any) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, float):
            return value
        if kind is str:
            if not value.isprintable():
                raise NotPlainData(value)
            return value
        if kind is dict or kind is list:
            if id(value) in seen:
                raise NotPlainData("a shared container")
            seen.add(id(value))
            if kind is list:
                return [copy(item) for item in value]
            if any(type(key) is not str for key in value):
                raise NotPlainData("a key that is not a str")
            return {copy(key): copy(item) for key, item in value.items()}  # a key is a string to check too
        raise NotPlainData(kind.__name__)

    return copy(data)


def _takes_timeout(strategy_class: type) -> bool:
    return "timeout" in inspect.signature(strategy_class.__init__).parameters


def strategy_with_timeout(strategy: str | Strategy, timeout: timedelta) -> str | Strategy:
    """The trainer's `strategy` argument with collectives that give up after `timeout`: a registered name (ddp, fsdp,
    deepspeed_stage_2, ...) becomes its strategy built with the public `timeout` argument; anything else is returned
    as it is (see set_collective_timeout for the strategy the trainer then holds)."""
    if not isinstance(strategy, str) or strategy not in StrategyRegistry:  # "auto", or an instance
        return strategy
    entry = StrategyRegistry[strategy]  # what StrategyRegistry.get(name) builds, with the timeout added
    if not _takes_timeout(entry["strategy"]):
        return strategy
    return entry["strategy"](**entry["init_params"], timeout=timeout)


def set_collective_timeout(strategy: Strategy, timeout: timedelta) -> None:
    """Give `timeout` to a built strategy that takes one but was not named (Lightning's choice under `auto`, or built
    from a class path before the run's timeout was known): private, read when the process group starts."""
    if _takes_timeout(type(strategy)) and collective_timeout(strategy) not in (None, timeout):
        setattr(strategy, TIMEOUT_ATTRIBUTE, timeout)


def collective_timeout(strategy: Strategy) -> timedelta | None:
    """How long the strategy's collectives wait for a peer (None: it starts no process group of its own)."""
    value = getattr(strategy, TIMEOUT_ATTRIBUTE, None)
    return value if isinstance(value, timedelta) else None


def compute_dtype(plugin: Any) -> torch.dtype:
    """The dtype a precision plugin computes in (the ThroughputMonitor's choice of peak FLOPs)."""
    from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype

    return _plugin_to_compute_dtype(plugin)


def summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *columns: tuple[str, list[str]],
) -> str:
    """Lightning's model-summary table of `columns` (name, values) and its totals, as ModelSummary prints it."""
    from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

    return _format_summary_table(
        total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
    )


def trainer_logs_now(trainer: L.Trainer, step_taken: bool = False) -> bool:
    """Whether the trainer writes its logs at this training batch: every log_every_n_steps optimizer steps, and when
    it stops. Lightning's own answer (`trainer._logger_connector.should_update_logs`) is private; this is its rule in
    public attributes, the one place the package decides it. Before the batch's optimizer step (training_step,
    on_before_optimizer_step) global_step counts the steps before it; after (on_train_batch_end), this one too.
    """
    if trainer.log_every_n_steps == 0:
        return False
    step = trainer.global_step + (0 if step_taken else 1)
    return step % trainer.log_every_n_steps == 0 or trainer.should_stop


def log_step_metrics_now(trainer: L.Trainer) -> None:
    """Log the training step's metrics now, as Lightning does right after on_train_batch_end (at its logging
    interval): a callback that ends the run in that hook would otherwise leave that step out of the logs."""
    trainer._logger_connector.update_train_step_metrics()
