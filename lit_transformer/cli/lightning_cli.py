"""fit, validate, test and predict: LightningCLI with the package's links, run folder and callbacks.

The program's entry point, its other commands and its refusals live in program.py and arguments.py; this module
(and so Lightning) is imported only by these four commands.

python -m lit_transformer fit --config configs/base.yaml
python -m lit_transformer fit --config configs/base.yaml --config configs/variants/post_ln.yaml
python -m lit_transformer generate --checkpoint runs/shakespeare/checkpoints/last.ckpt --prompt "ROMEO:"
python -m lit_transformer translate --checkpoint runs/en-es/checkpoints/last.ckpt --text "In the beginning"
python -m lit_transformer prepare --config configs/base.yaml   # the data once: token shards that fit then reads
python -m lit_transformer average --checkpoints runs/en-es/checkpoints --last 5 --output runs/en-es/avg.ckpt
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import docstring_parser
import jsonargparse
import lightning as L
from jsonargparse import _typehints as jsonargparse_typehints
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_info

from lit_transformer.checkpoints.atomic_io import AtomicCheckpointIO
from lit_transformer.checkpoints.files import CheckpointError, MissingCheckpointError, load_checkpoint
from lit_transformer.checkpoints.run_checkpoint import RunCheckpoint, last_checkpoint, recorded_best
from lit_transformer.cli.arguments import (
    check_data_flags_after_its_class,
    check_flag_order,
    check_group_files,
    check_one_data_class,
    given_fields,
    given_where,
    help_by_import_path,
    known_keys,
    parser_options,
    refusal,
    resolve_configs,
)
from lit_transformer.cli.console import ModelSummaryWithoutFlops, quiet_dependencies
from lit_transformer.cli.fast_parsing import ValidatedOnceParser, index_action_lookups, split_keys_once
from lit_transformer.cli.program import COMMANDS, main, program  # noqa: F401 - main: `lit_transformer.cli.main` as before
from lit_transformer.config import SOURCE_FIELDS, GenerationConfig, TransformerConfig
from lit_transformer.engine.devices import check_device_options, lost_peer_message, resume_after_restart
from lit_transformer.engine.host_allocator import keep_freed_memory
from lit_transformer.engine.lightning_compat import LightningCLIHooks, set_collective_timeout, strategy_with_timeout
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.engine.monitoring import LearningRateLogger, SyncFreeProgressBar, TokenThroughputMonitor
from lit_transformer.engine.nonfinite_guard import NonFiniteLossGuard
from lit_transformer.engine.optimizers import Optimization, check_optimizer_precision, check_optimizer_strategy
from lit_transformer.engine.preemption import PreemptionCheckpoint, exit_on_signals
from lit_transformer.engine.step_seed import StepSeed
from lit_transformer.engine.task_outputs import AttentionMaps, GenerateSamples, PredictionWriter
from lit_transformer.errors import ConfigError, UserError, check_folder_can_be_made
from lit_transformer.tasks import task_class_of
from lit_transformer.transforms.options import LoraOptions

# Field docstrings of TransformerConfig become --help text.
jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)


# Packages that document a class's parameters in its docstrings, never in attribute docstrings: their classes' source
# is not read for them. LightningModule's alone (LitTransformer's base) took 0.3 s to compile, half the CPU of
# building a command's parser, paid by every command; the --help texts are the same without it.
DOCSTRINGS_ONLY = ("lightning", "torch")


def _parse_once(parse: Callable) -> Callable:
    """docstring_parser.parse_from_object, each (object, style) parsed once per process, and a class of
    DOCSTRINGS_ONLY from its docstring alone. jsonargparse reads attribute docstrings from source (inspect.getsource,
    then compile) for every class it adds, and again for each of fit, validate, test and predict: without the cache,
    two thirds of the CLI's start-up (about 2 s of CPU of a 3 s parse)."""
    cache: dict = {}

    @functools.wraps(parse)
    def parse_from_object(obj, *args, **kwargs):
        try:
            key = (obj, args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:
            return parse(obj, *args, **kwargs)
        if key not in cache:
            if inspect.isclass(obj) and obj.__module__.partition(".")[0] in DOCSTRINGS_ONLY:
                cache[key] = docstring_parser.parse(obj.__doc__, *args, **kwargs)
            else:
                cache[key] = parse(obj, *args, **kwargs)
        return cache[key]

    return parse_from_object


if not hasattr(docstring_parser.parse_from_object, "__wrapped__"):
    docstring_parser.parse_from_object = _parse_once(docstring_parser.parse_from_object)
index_action_lookups()  # jsonargparse finds each key's action in an index, not by walking 189 options (fast_parsing.py)
split_keys_once()  # and splits each key of a namespace once a process, not at each get and set (fast_parsing.py)


def _task_names_merge(merge: Callable) -> Callable:
    """jsonargparse's merge of a subclass spec with the value before it, where that value is a task's short name
    (`model.task: translation` in one config, `model.task.init_args.label_smoothing` in a later one or a flag, as
    configs/variants/label_smoothing.yaml gives it): the short name stands for its class, as a class name or import
    path does. jsonargparse knows no short names, so the init_args were refused ("expected Task or a string")."""

    @functools.wraps(merge)
    def subclass_spec_as_namespace(val, prev_val=None):
        if isinstance(prev_val, str) and isinstance(
            val, dict | jsonargparse.Namespace | jsonargparse_typehints.NestedArg
        ):
            from lit_transformer.tasks import TASKS

            cls = TASKS.get(prev_val)
            if cls is not None:
                prev_val = jsonargparse.Namespace(class_path=jsonargparse_typehints.get_import_path(cls))
        return merge(val, prev_val)

    return subclass_spec_as_namespace


_merge = getattr(jsonargparse_typehints, "subclass_spec_as_namespace", None)  # private: absent, short names go unmerged
if _merge is not None and not hasattr(_merge, "__wrapped__"):
    jsonargparse_typehints.subclass_spec_as_namespace = _task_names_merge(_merge)

# How long a collective (all-reduce, barrier) waits for a peer before the run fails: a hung or unreachable node ends
# the others within this, not torch's 30 minutes. Data preparation waits without limit (Lightning's own barrier).
COLLECTIVE_TIMEOUT_S = 600.0

# What the tokenizer decides, the model config must follow: linked once the DataModule exists.
TOKENIZER_LINKS = ("vocab_size", "target_vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id")
# What the data decides of the architecture: the number of classes (None for language-model and translation data).
# What it decides of the task (label names, multi_label, bits per character, ...) the task reads itself (Task.reads).
DATA_LINKS = ("num_labels",)
# The run folder is one value, trainer.default_root_dir: the TensorBoard logger's save_dir and the checkpoints' dirpath
# default to this placeholder, which resolve_run_folder replaces by it. A value given explicitly is kept.
RUN_FOLDER = "${trainer.default_root_dir}"


class TransformerCLI(LightningCLIHooks):
    """LightningCLI with the tokenizer linked into the model config and the run's standard callbacks. Only the
    parser of the command that runs is built (LightningCLI builds all four, a second each)."""

    def __init__(self, *args, **kwargs) -> None:
        given = kwargs.get("args")
        argv = list(sys.argv[1:] if given is None else given) if isinstance(given, list | tuple | None) else []
        self._only = argv[0] if argv and argv[0] in LightningCLI.subcommands() else None
        kwargs.setdefault("parser_class", ValidatedOnceParser)
        kwargs.setdefault("save_config_callback", RunConfigFile)
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override] - LightningCLI's is a staticmethod
        every = LightningCLI.subcommands()
        only = getattr(self, "_only", None)
        return {only: every[only]} if only else every

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """A parse error becomes a UserError naming the key, where it was given and the nearest valid keys."""
        argv = list(sys.argv[1:] if args is None else args) if isinstance(args, list | tuple | None) else []
        if any(".help" in a for a in argv):
            args = argv = help_by_import_path(argv)
        subparser = _subcommand_parser(parser, argv[0] if argv else None)
        describe_package_defaults(subparser or parser)
        check_flag_order(argv[1:])  # before the parse: a flag a later config sets again is the mistake to name
        check_group_files(argv[1:], known_keys(subparser or parser))
        check_one_data_class(argv[1:])
        check_linked_folders(argv[1:])
        self._given_argv = argv[1:] if argv and argv[0] in LightningCLI.subcommands() else argv
        if any(a.partition("=")[0] == "--print_config" for a in self._given_argv):
            (subparser or parser).__dict__["_lit_before_print"] = functools.partial(
                printed_decoding, argv=self._given_argv
            )
        try:
            super().parse_arguments(parser, args)
        except jsonargparse.ArgumentError as error:
            check_data_flags_after_its_class(argv[1:])
            raise refusal(str(error), subparser or parser, argv[1:]) from None
        config = self.config.get(argv[0]) if argv and argv[0] in LightningCLI.subcommands() else self.config
        seed = config.get("seed_everything") if hasattr(config, "get") else None
        if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed <= 2**32 - 1:
            # before Lightning seeds: its ValueError was a traceback
            raise ConfigError(
                f"seed_everything={seed} is outside the seeds numpy takes (0 to {2**32 - 1}): give a seed in that "
                "range",
                keys=["seed_everything"],
            )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in TOKENIZER_LINKS + DATA_LINKS:
            parser.link_arguments(f"data.{name}", f"model.config.{name}", apply_on="instantiate")
        # Each callback gets its own group (--checkpoint.*, --samples.*, ...), so YAMLs and flags can tune it.
        # Two checkpointers in one folder. `checkpoint` writes last.ckpt every N steps whatever the metrics (a
        # ModelCheckpoint that monitors a validation metric defers even last.ckpt until the first validation, which
        # loses work); `best_checkpoint` keeps the best by the validation split's per-token NLL (the loss without label
        # smoothing); for translation `--best_checkpoint.monitor val/bleu --best_checkpoint.mode max` selects by BLEU.
        # RunCheckpoint: a ModelCheckpoint whose record of the run's files survives a moved folder, another interval
        # and a validation at a checkpoint step.
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.add_lightning_class_args(RunCheckpoint, "best_checkpoint")
        parser.link_arguments("checkpoint.dirpath", "best_checkpoint.dirpath")
        parser.set_defaults(
            {
                "checkpoint.dirpath": f"{RUN_FOLDER}/checkpoints",
                "checkpoint.monitor": None,
                "checkpoint.save_last": True,
                "checkpoint.save_top_k": 0,
                "checkpoint.every_n_train_steps": 100,
                "best_checkpoint.filename": "best-step{step:06d}-val_nll{val/nll:.3f}",
                "best_checkpoint.auto_insert_metric_name": False,
                "best_checkpoint.monitor": "val/nll",
                "best_checkpoint.mode": "min",
                "best_checkpoint.save_top_k": 1,
                "best_checkpoint.save_last": False,
            }
        )
        # Reliability: exact resume (per-step seeding), skipped non-finite steps, a checkpoint on SIGTERM/SIGINT.
        parser.add_lightning_class_args(StepSeed, "step_seed")
        parser.add_lightning_class_args(NonFiniteLossGuard, "nonfinite")
        parser.add_lightning_class_args(PreemptionCheckpoint, "preemption")
        parser.link_arguments("checkpoint.dirpath", "preemption.dirpath")
        parser.add_lightning_class_args(GenerateSamples, "samples")
        parser.add_lightning_class_args(AttentionMaps, "attention")
        parser.add_lightning_class_args(TokenThroughputMonitor, "throughput")
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        parser.add_argument(
            "--collective_timeout",
            type=float | None,
            default=COLLECTIVE_TIMEOUT_S,
            help="Seconds a collective waits for a peer (another process or node) before the run fails with one line "
            "naming the lost rank; None keeps the strategy's own (torch's 30 minutes).",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        filled = set(getattr(self, "_run_folder_filled", ())) | set(resolve_run_folder(config))
        expand_user_paths(config)
        if isinstance(self.save_config_callback, type) and issubclass(self.save_config_callback, RunConfigFile):
            self.save_config_kwargs = {**self.save_config_kwargs, "run_folder_fields": tuple(sorted(filled))}
        link_context_length(config, self.subcommand)
        set_once(config)
        trainer = config.trainer
        strategy = trainer.strategy
        if not isinstance(strategy, str):  # a {class_path, init_args} mapping
            strategy = getattr(strategy, "class_path", None) or str(strategy)
        if self.subcommand == "fit":  # before data or model: Muon and a sharding strategy cannot train together
            check_fit_trains(trainer)
            optim = config.get("model.optim")
            if optim is not None and optim.get("optimizer") == "muon":
                check_optimizer_strategy(Optimization(optimizer="muon"), strategy)
            if optim is not None:  # an eps that fp16 rounds to 0 turns every weight NaN at the first step
                check_optimizer_precision(optim.get("optimizer"), optim.get("eps"), trainer.precision)
        check_device_options(trainer.accelerator, strategy, trainer.precision)
        check_trainer_options(trainer)
        check_run_folders(config)
        check_task_and_data(config)
        check_before_data(config, self.subcommand)
        log_evaluation_beside_training(config, self.subcommand)

    def instantiate_classes(self) -> None:
        """The parsed config (and its command's part), validated at the parse and adjusted since by the package
        alone, is dumped into the model's hyperparameters and config.yaml without being validated twice more."""
        if isinstance(self.parser, ValidatedOnceParser):
            self.parser.trust(self.config)
        subparser = _subcommand_parser(self.parser, self.subcommand) if self.subcommand else None
        if isinstance(subparser, ValidatedOnceParser):  # the parser SaveConfigCallback writes config.yaml with
            subparser.trust(self.config.get(self.subcommand))
        config = self.config[self.subcommand] if self.subcommand else self.config
        groups = {
            key: value.as_dict()
            for key, value in vars(config).items()
            if key not in ("model", "data", "trainer") and isinstance(value, jsonargparse.Namespace)
        }
        with lightning_refusals(callbacks=groups):  # a callback group's options, refused as Lightning built it
            super().instantiate_classes()
        trained, self._trained = getattr(self, "_trained", None), None
        task = getattr(self.model, "task", None)
        if task is not None:
            self._decode_from_task_defaults(config, task)
        if trained is None and task is not None and hasattr(self.datamodule, "check_task"):
            # the architecture's task, now that the model is built (a given one and a checkpoint's were judged before)
            self.datamodule.check_task(task.name, type(task).__name__)
        if trained is not None and hasattr(self.datamodule, "check_trained"):  # before any data is prepared
            self.datamodule.check_trained(*trained, resuming=self.subcommand == "fit")
        if trained is None and getattr(self.model, "init_from", None):
            line = init_from_settings_line(config.get("model"), self.model)
            if line:
                rank_zero_info(line)

    def _decode_from_task_defaults(self, config, task) -> None:
        """model.generation and samples.generation, where given, start from the task's decoding defaults, as
        `generate`, `translate` and `serve` do: jsonargparse filled each field the command line and its configs leave
        unset with a bare GenerationConfig's default, so `predict --model.generation.top_k 10` decoded greedily (not
        the language model's temperature 0.8) and a translation preset's `generation: {num_beams: 2}` ranked by the
        plain length penalty 1.0 (not the paper's GNMT 0.6 with early stopping). The merged values are what the run
        records (hyperparameters, config.yaml)."""
        names = GENERATION_FIELDS
        samples = next((c for c in self.trainer.callbacks if isinstance(c, GenerateSamples)), None)
        for group, owner in (("model", self.model), ("samples", samples)):
            parsed = getattr(owner, "generation", None)
            if not isinstance(parsed, GenerationConfig):
                continue
            merged = task_decoding(task, parsed, f"{group}.generation", getattr(self, "_given_argv", []))
            if merged == parsed:
                continue
            owner.generation = merged
            if group == "model" and "generation" in getattr(owner, "hparams", {}):
                # Plain data, as LightningCLI records it: a checkpoint is read with weights_only=True, which refuses a
                # GenerationConfig object (test --ckpt_path, translate, average and resuming could not load the run).
                owner.hparams["generation"] = dataclasses.asdict(merged)
            # config.yaml too: RunConfigFile writes a clone of the config, taken before this merge
            saved = [c.config for c in self.trainer.callbacks if isinstance(c, SaveConfigCallback)]
            for namespace in [config, *(c for c in saved if c is not config)]:
                recorded = namespace.get(f"{group}.generation") if hasattr(namespace, "get") else None
                if isinstance(recorded, jsonargparse.Namespace):
                    for name in names:
                        recorded[name] = getattr(merged, name)

    def build_trainer(self, config: dict, callbacks: list) -> L.Trainer:
        config, callbacks = switched_off(config, callbacks)
        # A checkpoint that keeps last.ckpt after the others: its file, written again after a validation, then records
        # the best checkpoint that validation wrote (see RunCheckpoint). Lightning keeps their relative order.
        callbacks = sorted(callbacks, key=lambda c: isinstance(c, ModelCheckpoint) and c.save_last is True)
        # The progress bar reads its metrics only when the trainer logs (see SyncFreeProgressBar), unless the run
        # turned the bar off or brought its own.
        existing = config.get("callbacks") or []
        given = [*callbacks, *(existing if isinstance(existing, list) else [existing])]
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
            callbacks = [*callbacks, SyncFreeProgressBar()]
        # Lightning's default summary shows a FLOPs column of zeros: ours leaves it out (see console.py).
        if config.get("enable_model_summary") is not False and not any(isinstance(c, ModelSummary) for c in given):
            callbacks = [*callbacks, ModelSummaryWithoutFlops()]
            config = {**config, "enable_model_summary": False}  # the default's place is taken, without a notice
        seconds = (self.config[self.subcommand] if self.subcommand else self.config).get("collective_timeout")
        with lightning_refusals(also=(TypeError, ValueError)):  # all the Trainer judges here is the user's options
            if seconds is None:
                return super().build_trainer(config, callbacks)
            # What init_process_group is given: through a named strategy's `timeout` argument, or set on the one
            # the trainer chose (auto) or that was built from a class path.
            timeout = timedelta(seconds=seconds)
            config = {**config, "strategy": strategy_with_timeout(config.get("strategy", "auto"), timeout)}
            trainer = super().build_trainer(config, callbacks)
        set_collective_timeout(trainer.strategy, timeout)
        return trainer

    def run_subcommand(self, subcommand: str) -> None:
        """A collective that fails because a peer died or hung ends this process with one line (which rank was
        lost, how to resume) and exit status 1, not a traceback from inside gloo or NCCL."""
        if subcommand == "fit":
            claim_tensorboard_version(self.trainer)  # before the trainer first reads its log_dir
        try:
            with lightning_refusals():
                super().run_subcommand(subcommand)
        except ValueError as error:
            # Judged once the data is ready (the epoch's batches): an interval longer than the epoch, with
            # check_val_every_n_epoch set. Lightning's message names both keys: refused as its other refusals are.
            if "`val_check_interval`" not in str(error):
                raise
            with lightning_refusals(also=(ValueError,)):
                raise
        except RuntimeError as error:
            message = lost_peer_message(error, self.trainer)
            if message is None:
                raise
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
            raise SystemExit(1) from None
        except (AttributeError, TypeError) as error:  # pickle's own errors for an object it cannot pickle
            start = getattr(self.trainer.strategy, "_start_method", None)
            if start not in ("spawn", "forkserver") or "pickle" not in str(error):
                raise
            raise ConfigError(
                f"{type(self.trainer.strategy).__name__} (start method {start}) starts each process by pickling the "
                f"trainer, its callbacks and the model, and this run holds something pickle refuses ({error}). Use "
                "--trainer.strategy ddp, which starts the processes without pickling them.",
                keys=["trainer.strategy"],
            ) from None
        if subcommand == "fit" and self.trainer.is_global_zero:
            line = checkpoints_line(self.trainer)
            if line:
                print(line, flush=True)

    def parse_checkpoint_hyperparameters(self) -> None:
        """LightningCLI builds the model from the hyperparameters saved in --ckpt_path, over the command line's. We
        load the file safely first (a corrupt, truncated or hostile file fails with a message that says what is
        wrong, and nothing in it ever runs), and keep the command line's run choices (LitTransformer.RUN_CHOICES):
        how to decode, quantize, compile or checkpoint activations is chosen per run (`predict
        --model.generation.temperature 0`, `fit --ckpt_path last --model.compile true`), not inherited from training."""
        subcommand = self.config.get("subcommand")
        if subcommand:  # first: the checkpoint folder below is read as a path, not as its RUN_FOLDER placeholder
            self._run_folder_filled = resolve_run_folder(self.config[subcommand])
        if subcommand == "fit":  # restarted by torchrun (--max-restarts): go on from the run's last checkpoint
            dirpath = (self.config.fit.get("checkpoint") or {}).get("dirpath")
            self.config.fit.ckpt_path = resume_after_restart(self.config.fit.get("ckpt_path"), dirpath)
            if self.config.fit.ckpt_path is None and dirpath:
                note_earlier_run(dirpath)
            else:  # resuming: the run's own folder holds its files, as it should
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path == "last":  # the file Lightning will resume from: its hyperparameters apply as a file's do
            dirpath = (self.config[subcommand].get("checkpoint") or {}).get("dirpath")
            path = last_checkpoint(dirpath) if dirpath else None
            if path is None and subcommand == "fit":  # a job script's first start: Lightning's hint (save_last) misled
                rank_zero_info(f"note: --ckpt_path last: no last.ckpt in {dirpath} yet, so a new run starts there")
                warnings.filterwarnings(
                    "ignore", message=r'.*ckpt_path="last"\) is set, but there is no last checkpoint'
                )
            if path is None and subcommand != "fit":  # fit starts afresh (Lightning warns); evaluation must not
                raise MissingCheckpointError(
                    f"--ckpt_path last: there is no last.ckpt in {dirpath} (checkpoint.dirpath) to {subcommand}, and "
                    "a model that was never trained would be scored. Give the run's folder "
                    "(--trainer.default_root_dir, as fit had it) or a checkpoint file: --ckpt_path PATH.ckpt",
                    keys=["ckpt_path", "trainer.default_root_dir", "checkpoint.dirpath"],
                )
        if path == "best":  # a new process has no callback that remembers a best: the run's last.ckpt records it
            path = self.config[subcommand].ckpt_path = run_best_checkpoint(self.config[subcommand], subcommand)
        if not path and subcommand in ("validate", "test", "predict"):
            model = self.config[subcommand].get("model") or {}
            if not model.get("init_from"):  # the model the configs build: random weights
                raise MissingCheckpointError(
                    f"{subcommand} needs a trained model: give --ckpt_path PATH.ckpt (or last, or best, of the run "
                    "folder --trainer.default_root_dir), or --model.init_from for pretrained weights; without either, "
                    "the untrained model the configs build would be scored",
                    keys=["ckpt_path"],
                )
        if path == "hpc":  # Lightning's SLURM requeue file in the run folder; none there was a ValueError traceback
            root = Path(self.config[subcommand].get("trainer", {}).get("default_root_dir") or ".")
            if not (root.is_dir() and any(root.glob("hpc_ckpt_*.ckpt"))):
                raise MissingCheckpointError(
                    f"--ckpt_path hpc: there is no hpc_ckpt_N.ckpt (Lightning's SLURM requeue checkpoint) in {root}; "
                    "the package's preemption saves the run's last.ckpt: resume with --ckpt_path last",
                    keys=["ckpt_path", "trainer.default_root_dir"],
                )
        if not path or path in ("hpc", "registry") or str(path).startswith("registry:"):
            return
        if subcommand in ("validate", "test", "predict"):
            note_newer_run(str(path), subcommand)
        if (Path(path) / "config.json").is_file():  # an export or a Hugging Face folder: weights to start from
            raise MissingCheckpointError(
                f"--ckpt_path {path} is a model folder, not a checkpoint (which holds a run's state as well): to "
                f"{'fine-tune' if subcommand == 'fit' else subcommand} it, start from its weights and read the data "
                f"with its tokenizer: --model.init_from {path} --data.init_args.tokenizer {Path(path) / 'tokenizer.json'}"
                ", without --ckpt_path",
                keys=["ckpt_path"],
            )
        checkpoint = load_checkpoint(path, mmap=True)  # the weights are not read here: Lightning loads them later
        data_class = _data_class(self.config[subcommand].get("data"))
        if data_class is not None and hasattr(data_class, "check_task"):  # before the model is built from it
            task = task_class_of(dict(checkpoint.get("hyper_parameters") or {}))
            if task is not None:
                data_class.check_task(task.name, task.__name__, str(path))
                if subcommand == "predict" and task.cannot_predict:  # before any data, and before the output is opened
                    raise CheckpointError(
                        f"predict --ckpt_path {path}: {task.cannot_predict.replace('THIS.ckpt', str(path))}",
                        keys=["ckpt_path"],
                    )
        if subcommand == "fit":
            if "optimizer_states" not in checkpoint:  # Lightning's KeyError blamed save_weights_only
                averaged = checkpoint.get("averaged_from")
                what = f"an average of {len(averaged)} checkpoints" if averaged else "no optimizer state"
                raise CheckpointError(
                    f"--ckpt_path {path} holds weights only ({what}), so it cannot resume a run: start a new run "
                    f"from its weights with --model.init_from {path} (without --ckpt_path), or resume from the "
                    "run's own last.ckpt",
                    keys=["ckpt_path"],
                )
            check_no_newer_last(self.config.fit, str(path), checkpoint)
        self._trained = (checkpoint, str(path))  # checked against the DataModule once it exists
        if subcommand != "fit":
            read_as_trained(self.config[subcommand], checkpoint, str(path))
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        # A LitTransformer built in Python records its dataclass arguments (TransformerConfig, GenerationConfig,
        # LoraOptions) as objects, where the CLI's record dicts: read both as the dicts the parser takes.
        for name, value in hparams.items():
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                hparams[name] = dataclasses.asdict(value)
        for name in LitTransformer.RUN_CHOICES:
            hparams.pop(name, None)
        if subcommand == "fit":
            keep_schedule_length(self.config.fit.get("model"), hparams)
        keep_one_embedding(hparams, checkpoint)
        if hparams.get("lora") and hparams.get("init_from"):  # a LoRA checkpoint: its base is read again
            check_lora_base(self.config[subcommand].model, hparams, str(path))
        unused = unused_settings(self.config[subcommand].get("model"), hparams, training=subcommand == "fit")
        if unused:
            rank_zero_info(unused_settings_line(str(path), unused, subcommand))
        if hparams:
            try:
                self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
            except (jsonargparse.ArgumentError, SystemExit) as error:
                detail = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
                raise CheckpointError(
                    f"the hyperparameters saved in {path} do not parse as this version's LitTransformer ({detail}): "
                    "it was written by another version or another program"
                ) from None


def keep_one_embedding(hparams: dict, checkpoint: dict) -> None:
    """A translation run of two tokenizers of one size written before TransformerConfig.shares_embeddings shared only
    where target_vocab_size is unset: its config (target_vocab_size equal to vocab_size, share_embeddings unset) gave
    both sides one embedding matrix, and its weights and optimizer state are of one. It is read as it was trained."""
    config = hparams.get("config")
    config = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    if not isinstance(config, dict) or config.get("share_embeddings") is not None:
        return
    if config.get("topology") != "encoder_decoder" or config.get("target_vocab_size") != config.get("vocab_size"):
        return
    import torch

    state = checkpoint.get("state_dict") or {}
    source, target = state.get("model.src_embed.weight"), state.get("model.tgt_embed.weight")
    if source is not None and target is not None and source.shape == target.shape and torch.equal(source, target):
        hparams["config"] = {**config, "share_embeddings": True}


def check_no_newer_last(config, path: str, checkpoint: dict) -> None:
    """A fit resumed from an earlier checkpoint of its own folder (`--ckpt_path best`, a kept snapshot) would write
    last.ckpt over the run's later state at its first save: refused, naming the way that keeps both (another folder)
    and the one that gives the later state up (remove last.ckpt first).

    A last.ckpt that cannot be read (torn by a crash: the refusal of `--ckpt_path last` names the whole checkpoints
    beside it, to resume from) holds no step to compare and no state to resume: it is moved aside, said in a
    warning, so that the run's first save neither fails on it nor writes over what may still be worth a look."""
    dirpath = (config.get("checkpoint") or {}).get("dirpath")
    if not dirpath or Path(path).resolve().parent != Path(dirpath).resolve():
        return
    step, unreadable = checkpoint.get("global_step", 0), []
    for last in _last_checkpoints(dirpath):
        try:
            if Path(last).samefile(path):
                break
            newer = load_checkpoint(last, mmap=True).get("global_step", 0)
        except FileNotFoundError:  # moved aside by another process of the run meanwhile
            continue
        except CheckpointError:
            if Path(last).is_file():  # (not gone meanwhile: a MissingCheckpointError)
                unreadable.append(last)
            continue  # the next newest last*.ckpt is what `last` means once this one is aside
        if newer > step:  # refused with the folder as it was
            raise ConfigError(
                f"--ckpt_path {path} (step {step}) resumes inside its run's folder, whose {Path(last).name} is at "
                f"step {newer}: its first save would write over that later state. Resume it into another folder "
                "(--trainer.default_root_dir NEW), or remove the later checkpoint first to go on from here",
                keys=["ckpt_path", "trainer.default_root_dir"],
            )
        break
    for last in unreadable:
        set_aside_unreadable(last, path)


def _last_checkpoints(dirpath: str) -> list[str]:
    """The folder's last*.ckpt files, newest first: the first is the one `--ckpt_path last` resumes from
    (run_checkpoint.last_checkpoint), the next what it would be without the first."""
    folder = Path(dirpath)
    found = [p for p in folder.glob("last*.ckpt") if p.is_file()] if folder.is_dir() else []
    return [str(p) for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


def set_aside_unreadable(last: str, path: str) -> None:
    """Rename an unreadable last*.ckpt to NAME.unreadable (.1, .2, ... where taken): a name no glob of checkpoints and
    no `--ckpt_path last` picks up, in the same folder. Done by one process (global rank 0): the others read on past
    it, as rank 0 does once it is gone."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) != 0:
        return
    aside, number = Path(f"{last}.unreadable"), 0
    while aside.exists():
        number += 1
        aside = Path(f"{last}.unreadable.{number}")
    try:
        Path(last).rename(aside)
    except FileNotFoundError:  # another process of the run moved it first
        return
    except OSError as error:
        raise CheckpointError(
            f"{last} cannot be read, and could not be moved aside ({error.strerror}): the run would write its new "
            f"{Path(last).name} over it. Move it out of the folder yourself, then run again with --ckpt_path {path}",
            keys=["ckpt_path"],
        ) from None
    warnings.warn(
        f"{last} cannot be read as a checkpoint (torn by a crash, corrupt, or refused as unsafe), so this run, "
        f"resumed from {path}, moved it aside to {aside}, where no save writes over it: look at it or delete it",
        stacklevel=2,
    )


def run_best_checkpoint(config, subcommand: str) -> str:
    """`--ckpt_path best`: the best checkpoint (by best_checkpoint.monitor) that the run folder's last.ckpt records,
    or a MissingCheckpointError naming the folder and the way to give a file."""
    dirpath = (config.get("checkpoint") or {}).get("dirpath")
    monitor = (config.get("best_checkpoint") or {}).get("monitor")
    best = recorded_best(dirpath, monitor) if dirpath else None
    if best is None:
        present = sorted(p.name for p in Path(dirpath).glob("*.ckpt")) if dirpath and Path(dirpath).is_dir() else []
        holds = f" (it holds {', '.join(present)})" if present else ""
        raise MissingCheckpointError(
            f"--ckpt_path best: no last.ckpt in {dirpath} (checkpoint.dirpath) records a best checkpoint by {monitor} "
            f"to {subcommand}{holds}. Give the run's folder (--trainer.default_root_dir, as fit had it) or a "
            "checkpoint file: --ckpt_path PATH.ckpt",
            keys=["ckpt_path", "trainer.default_root_dir", "checkpoint.dirpath"],
        )
    rank_zero_info(f"--ckpt_path best: {best}, the best by {monitor} that {Path(dirpath) / 'last.ckpt'} records")
    return best


def keep_schedule_length(model, hparams: dict) -> None:
    """A resumed run keeps its checkpoint's recipe, but `--model.optim.schedule_steps` given on the command line is
    the run's length, as trainer.max_steps is: it replaces the checkpoint's (which the schedule otherwise takes from
    max_steps, so a run resumed to train longer follows the longer schedule; LitTransformer says so at the start)."""
    given = ((model or {}).get("optim") or {}).get("schedule_steps")
    saved = hparams.get("optim")
    if given is None or saved is None:
        return
    if dataclasses.is_dataclass(saved):
        hparams["optim"] = dataclasses.replace(saved, schedule_steps=given)
    else:
        hparams["optim"] = {**dict(saved), "schedule_steps": given}


def unused_settings(model, hparams: dict, training: bool) -> list[tuple[str, object, object]]:
    """(key, the command line's value, the checkpoint's) for each setting of the model's architecture and task (and,
    `training`, its recipe: the optimizer and the loss's normalization, which evaluation never reads) that the command
    line gives otherwise than the checkpoint whose hyperparameters replace it. A value the command line leaves unset
    or at its default is not counted: the data fills some of those (vocab_size, max_seq_len), and a default is what a
    config that never mentions the key holds."""
    if model is None:
        return []
    found = []
    # LoRA's options are the model's too: a checkpoint's adapters are scaled by its alpha, shaped by its rank.
    groups = (("config", TransformerConfig), ("lora", LoraOptions)) + ((("optim", Optimization),) if training else ())
    for group, cls in groups:
        given, saved = model.get(group), hparams.get(group)
        if given is None or saved is None:
            continue
        saved = dataclasses.asdict(saved) if dataclasses.is_dataclass(saved) else dict(saved)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name, value in vars(given).items() if hasattr(given, "__dict__") else dict(given).items():
            value, kept = _listed(value), _listed(saved.get(name))
            if name in saved and value is not None and value != defaults.get(name) and value != kept:
                found.append((f"model.{group}.{name}", value, kept))
    given, saved = model.get("task"), hparams.get("task")
    if getattr(given, "class_path", None) and isinstance(saved, dict) and given.class_path == saved.get("class_path"):
        init_args = saved.get("init_args") or {}
        for name, value in vars(given.get("init_args") or {}).items():
            if name in init_args and value is not None and value != init_args[name]:
                found.append((f"model.task.init_args.{name}", value, init_args[name]))
    # A full checkpoint's weights are the model: --model.init_from beside --ckpt_path is never read (a LoRA
    # checkpoint's is its base's new place, check_lora_base).
    value = model.get("init_from")
    if value and "init_from" in hparams and not hparams.get("lora") and value != hparams.get("init_from"):
        found.append(("model.init_from", value, hparams.get("init_from")))
    value, kept = model.get("loss_normalization"), hparams.get("loss_normalization")
    if training and kept is not None and value not in (None, "tokens", kept):
        found.append(("model.loss_normalization", value, kept))
    return found


def init_from_settings_line(given, model: Any) -> str | None:
    """The notice that names the architecture settings of the command line that `--model.init_from` replaced with
    its own (the weights fix the architecture): they were dropped without a word (`--model.config.n_layers 4` from
    a 2-layer checkpoint trained 2 layers). Fields the data decides (the vocabulary, the context) are not listed."""
    built = dataclasses.asdict(model.config)
    linked = set(TOKENIZER_LINKS) | set(DATA_LINKS) | {"max_seq_len", "tgt_vocab_size"}
    unused = [u for u in unused_settings(given, {"config": built}, training=False) if u[0].split(".")[-1] not in linked]
    if not unused:
        return None
    listed = "; ".join(f"{key} {value} (its: {kept})" for key, value, kept in unused)
    return (
        f"note: --model.init_from {model.init_from}: the architecture is that of the weights, so these settings are not "
        f"used: {listed}. To train another architecture, leave out init_from (or give a checkpoint of that one)."
    )


def unused_settings_line(path: str, unused: list[tuple[str, object, object]], subcommand: str) -> str:
    """The notice that says which settings --ckpt_path replaced, and how to train the weights with them."""
    listed = "; ".join(f"{key} {value} (the checkpoint's: {kept})" for key, value, kept in unused)
    line = f"--ckpt_path {path}: the model is the checkpoint's, so these settings are not used: {listed}."
    if subcommand == "fit":
        line += (
            " A resumed run goes on as it was trained; to train these weights with other settings, start a new run "
            f"from them: --model.init_from {path}, without --ckpt_path."
        )
    return line


def read_as_trained(config, checkpoint: dict, path: str) -> None:
    """validate, test and predict: the data settings changed so that the data reads as the checkpoint's model was
    trained to read it (its DataModule's `trained_args`: the saved tokenizer for a tokenizer kind, a classifier's
    classes for unset label_names, ...)."""
    data = config.get("data")
    cls = _data_class(data)
    init_args = data.get("init_args") if cls is not None and hasattr(cls, "trained_args") else None
    if init_args is not None:
        for key, value in cls.trained_args(dict(init_args), checkpoint, path).items():
            setattr(init_args, key, value)


def check_lora_base(model, hparams: dict, path: str) -> None:
    """A LoRA checkpoint records its base (init_from): `--model.init_from PATH` given with --ckpt_path says where that
    base is now (it moved, or this is another machine) and wins over the record; the fingerprint is checked all the
    same. A recorded base that is gone ends the command with one line naming it and that flag."""
    from lit_transformer.transforms.lora import locate_lora_base

    given = model.get("init_from") if model is not None else None
    hparams["init_from"] = locate_lora_base(hparams["init_from"], given, path, "--model.init_from PATH")


def _listed(value):
    """A tuple as the list a config holds (image_size), other values as they are."""
    return list(value) if isinstance(value, tuple) else value


def _data_class(data) -> type | None:
    """The DataModule class that a config's data.class_path names; None without one."""
    class_path = getattr(data, "class_path", None) if data is not None else None
    if not class_path:
        return None
    module, _, name = str(class_path).rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def set_once(config) -> None:
    """What the data decides of the architecture is set once: each model config field the data decides (its
    `model_fields`) is filled from the data when the model leaves it unset or at its default, and a different value
    fails naming both keys; a model with learned positions must hold the data's longest sequence."""
    data, model = config.get("data"), config.get("model")
    architecture = getattr(model, "config", None) if model is not None else None
    if architecture is None:
        return
    cls = _data_class(data)
    if cls is None or not hasattr(cls, "model_fields"):
        return
    args = dict(data.init_args or {})
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    source = architecture.get("source") or "tokens"
    for field, (key, value) in cls.model_fields(args).items():
        if any(field in fields for fields in SOURCE_FIELDS.values()) and field not in SOURCE_FIELDS.get(source, ()):
            continue  # a field of another source (a features model and the images' geometry): not this model's
        current = _listed(architecture.get(field))
        if current is None or current == defaults.get(field) or current == value:
            architecture[field] = value
        elif _listed(args.get(key)) != value:  # read from what the argument names (source_dim: the feature files)
            raise ConfigError(
                f"data.init_args.{key}={args[key]} gives {field}={value} and model.config.{field}={current}: the data "
                f"decides it, so leave model.config.{field} unset (or set it to {value})",
                keys=[f"data.init_args.{key}", f"model.config.{field}"],
            )
        else:
            raise ConfigError(
                f"data.init_args.{key}={value} and model.config.{field}={current} differ: the data decides it, so set "
                f"data.init_args.{key} alone (or both alike)",
                keys=[f"data.init_args.{key}", f"model.config.{field}"],
            )
    longest = cls.longest_sequence(args)
    max_seq_len = architecture.get("max_seq_len")
    learned = architecture.get("positions") == "learned"  # the only positions that cannot go past max_seq_len
    fields = {name: architecture.get(name) or defaults[name] for name in ("topology", "head", "pooling")}
    cls_token = fields == {"topology": "encoder_only", "head": "classification", "pooling": "cls"}
    if longest is not None and cls_token:  # the model prepends its [CLS] to the data's tokens
        longest = (longest[0], longest[1] + 1)
    if learned and longest is not None and max_seq_len is not None and longest[1] > max_seq_len:
        key, need = longest
        also = " (with the [CLS] token that pooling=cls prepends)" if cls_token else ""
        raise ConfigError(
            f"data.init_args.{key}={args[key]} needs {need} positions{also} but model.config.max_seq_len={max_seq_len}: "
            f"raise model.config.max_seq_len to {need} or more, or lower data.init_args.{key}",
            keys=[f"data.init_args.{key}", "model.config.max_seq_len"],
        )


@contextlib.contextmanager
def lightning_refusals(
    also: tuple[type[Exception], ...] = (), callbacks: dict[str, Any] | None = None
) -> Iterator[None]:
    """Lightning's refusals of a user's trainer options (MisconfigurationException: `max_steps` must be ...; while the
    Trainer is built, which judges nothing but those options, its TypeError and ValueError too: `devices` selected
    with `CPUAccelerator` should be an int > 0) as the ConfigError they are, naming the trainer keys its message
    names. With `callbacks` (each callback group's parsed options, while they are built), a refusal of a Lightning
    callback's options (ModelCheckpoint's `every_n_train_steps` must be >= 0) names the group keys whose given value
    the message quotes."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        yield
    except (MisconfigurationException, ConfigError, *also) as error:
        message = " ".join(str(error).split())
        named = dict.fromkeys(re.findall(r"\w+", message))
        keys = [
            f"{group}.{name}"
            for group, options in (callbacks or {}).items()
            for name in named
            if name in options and f"{name}={options[name]}" in message
        ]
        if isinstance(error, ConfigError):  # a callback of the package's refused its own option: say where it was given
            if keys and not error.keys:
                error.keys = tuple(keys)
            raise
        if isinstance(error, UserError):
            raise
        if callbacks is not None:
            raise ConfigError(f"Lightning refuses a callback's options: {message}", keys=keys) from error
        keys = [f"trainer.{name}" for name in named if name in TRAINER_ARGUMENTS]
        raise ConfigError(f"Lightning refuses the trainer options: {message}", keys=keys) from error


TRAINER_ARGUMENTS = frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}


# The trainer options that Lightning judges when it builds the Trainer and that a config gives as plain values.
PLAIN_TRAINER_OPTIONS = (
    "accelerator", "devices", "num_nodes", "precision", "fast_dev_run", "max_epochs", "min_epochs", "max_steps",
    "min_steps", "limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
    "overfit_batches", "val_check_interval", "check_val_every_n_epoch", "num_sanity_val_steps", "log_every_n_steps",
    "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "reload_dataloaders_every_n_epochs",
)  # fmt: skip


def check_trainer_options(trainer) -> None:
    """Lightning's own judgement of the trainer options, before the data builds a tokenizer: a Trainer of those
    options alone (no logger, callbacks or strategy), built quietly and thrown away; what it refuses is the
    ConfigError the real Trainer's refusal would be, later."""
    options = {name: trainer.get(name) for name in PLAIN_TRAINER_OPTIONS}
    options = {name: value for name, value in options.items() if isinstance(value, str | int | float | bool)}
    check_trainer_numbers(options)
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), lightning_refusals(also=(TypeError, ValueError)):
            warnings.simplefilter("ignore")
            L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **options)  # fmt: skip
    finally:
        quiet.setLevel(level)


def check_run_folders(config) -> None:
    """The folders a run writes its logs and checkpoints in (trainer.default_root_dir, checkpoint.dirpath, the
    logger's save_dir) are folders or can be made: a file there (or above) ended in a NotADirectoryError or
    FileExistsError traceback once the data was prepared."""
    folders = [("trainer.default_root_dir", config.get("trainer.default_root_dir"))]
    if "checkpoint" in config and config.get("checkpoint") is not None:
        folders.append(("checkpoint.dirpath", config.get("checkpoint").get("dirpath")))
    loggers = config.get("trainer.logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and hasattr(init_args, "get"):
            folders.append(("trainer.logger.init_args.save_dir", init_args.get("save_dir")))
    for key, folder in folders:
        if isinstance(folder, str | Path) and "://" not in str(folder):
            check_folder_can_be_made(folder, key, keys=[key])


GENERATION_FIELDS = [field.name for field in dataclasses.fields(GenerationConfig)]


def task_decoding(task: Any, parsed: Any, group: str, argv: Sequence[str]) -> GenerationConfig:
    """A decoding group (`model.generation`) as the run decodes: the task's defaults (its class or object), with the
    fields the command line and its configs give (jsonargparse filled the others with a bare GenerationConfig's)."""
    given = given_fields(group, GENERATION_FIELDS, argv)
    read = parsed.get if isinstance(parsed, jsonargparse.Namespace) else functools.partial(getattr, parsed)
    return GenerationConfig.for_task(task).replace(**{name: read(name) for name in given})


def printed_decoding(config, argv: Sequence[str]):
    """The config --print_config prints, with its decoding groups as the run would decode (task_decoding): it printed
    a bare GenerationConfig's fields, so a config written by `fit --config presets/tiny-translate --print_config`
    and given back decoded validation BLEU with length penalty 1.0, not the translation task's GNMT 0.6. The task is
    the config's model.task, else the one its architecture implies; neither known, the config is printed as parsed."""
    from lit_transformer.tasks import Task, task_class_of

    model = config.get("model") if "model" in config else None
    architecture = model.get("config") if model is not None else None
    try:
        cls = task_class_of({"task": model.get("task")}) if model is not None else None
        if (cls is None or cls is Task) and architecture is not None:  # the architecture's task, as build_task does
            cls = task_class_of({"config": dict(architecture.items())})
    except (UserError, TypeError, AttributeError):
        return config
    if cls is None or cls is Task:
        return config
    for group in ("model", "samples"):
        parsed = config.get(f"{group}.generation") if group in config else None
        if isinstance(parsed, jsonargparse.Namespace) and isinstance(parsed.get("init_args"), jsonargparse.Namespace):
            parsed = parsed.init_args  # a dataclass group, as jsonargparse holds it for a dump
        if isinstance(parsed, jsonargparse.Namespace):
            merged = task_decoding(cls, parsed, f"{group}.generation", argv)
            for name in GENERATION_FIELDS:
                parsed[name] = getattr(merged, name)
    return config


def check_fit_trains(trainer) -> None:
    """A fit that can train no batch is refused: Lightning ends it at once without a checkpoint (limit_train_batches
    0 ran the sanity check and said "checkpoints: none written"), and max_steps 0 was refused as "not set"."""
    for name, nothing in (("limit_train_batches", 0), ("max_steps", 0), ("max_epochs", 0)):
        value = trainer.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value == nothing:
            raise ConfigError(
                f"trainer.{name}={value} trains no batch, so fit would end at once with nothing saved: give a "
                f"positive {name}, or evaluate a checkpoint with validate --ckpt_path PATH",
                keys=[f"trainer.{name}"],
            )


def check_trainer_numbers(options: dict[str, Any]) -> None:
    """The trainer numbers Lightning takes without a word but cannot use: 0 batches to accumulate and a validation
    every 0 steps or epochs end in a ZeroDivisionError at the first step; a negative gradient_clip_val scales every gradient
    by a negative factor (torch's clip coefficient max_norm / norm), so the run climbs the loss."""

    def number(name: str) -> float | None:
        value = options.get(name)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    accumulate, interval, clip, every = (number(n) for n in ("accumulate_grad_batches", "val_check_interval",
                                                             "gradient_clip_val", "check_val_every_n_epoch"))  # fmt: skip
    if every is not None and every < 1:
        raise ConfigError(
            f"trainer.check_val_every_n_epoch={every} must be >= 1, or null to validate by steps "
            "(trainer.val_check_interval)",
            keys=["trainer.check_val_every_n_epoch"],
        )
    if accumulate is not None and accumulate < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches={accumulate} must be >= 1 (1 accumulates nothing)",
                          keys=["trainer.accumulate_grad_batches"])  # fmt: skip
    if interval is not None and interval <= 0:
        raise ConfigError(
            f"trainer.val_check_interval={interval} must be above 0: a number of training batches (an integer), or "
            "a fraction of an epoch (a float up to 1.0); to validate less, give more steps or a check_val_every_n_epoch",
            keys=["trainer.val_check_interval"],
        )
    if clip is not None and clip < 0:
        raise ConfigError(
            f"trainer.gradient_clip_val={clip} must be >= 0: a negative bound turns every gradient around (the loss "
            "climbs); give a positive bound such as 1.0, or 0 / null for no clipping",
            keys=["trainer.gradient_clip_val"],
        )


def check_before_data(config, subcommand: str | None) -> None:
    """What can be refused from the config alone is refused before the data is read or prepared: the model config
    (less the fields the data decides), predict's inputs, the steps a cosine schedule needs."""
    data, model = config.get("data"), config.get("model")
    init_args = getattr(data, "init_args", None)
    architecture = model.get("config") if model is not None else None
    if architecture is not None and hasattr(architecture, "items"):
        decided = set(TOKENIZER_LINKS + DATA_LINKS)
        cls = _data_class(data)
        if cls is not None and hasattr(cls, "model_fields"):
            decided |= set(cls.model_fields(dict(init_args or {})))
        TransformerConfig.check({k: v for k, v in dict(architecture.items()).items()}, unknown=decided)
        block = init_args.get("block_size") if init_args is not None else None
        context, learned = architecture.get("max_seq_len"), architecture.get("positions") == "learned"
        if learned and isinstance(block, int) and isinstance(context, int) and block > context:
            raise ConfigError(
                f"data.init_args.block_size={block} is longer than model.config.max_seq_len={context}, and learned "
                "positions cannot extrapolate past the table they trained: give a block_size of at most "
                f"{context}, or measure length extrapolation with sinusoidal, rope or alibi positions",
                keys=["data.init_args.block_size"],
            )
    init_from = model.get("init_from") if model is not None else None
    if isinstance(init_from, str) and init_from.endswith(".ckpt") and Path(init_from).is_file():
        # another task's checkpoint was refused only once the data had been prepared
        from lit_transformer.interop.pretrained import topology_mismatch

        topology = (architecture.get("topology") if architecture is not None else None) or "decoder_only"
        mismatch = topology_mismatch(init_from, load_checkpoint(init_from, mmap=True), topology)
        if mismatch is not None:
            raise mismatch
    if model is not None and model.get("compile_mode"):  # a typo failed at the first compiled step
        from lit_transformer.transforms.compilation import check_compile_mode

        check_compile_mode(model.get("compile_mode"))
    if subcommand == "predict" and init_args is not None and "predict_file" in init_args:
        if not init_args.get("predict_file") and not init_args.get("predict_dir"):
            from lit_transformer.data.base import PREDICT_FILE_NEEDED

            raise ConfigError(PREDICT_FILE_NEEDED, keys=["data.init_args.predict_file"])
        cls = _data_class(data)
        if init_args.get("predict_file") and hasattr(cls, "check_predict_file"):
            cls.check_predict_file(dict(init_args))
    optim = model.get("optim") if model is not None else None
    if subcommand != "fit" or optim is None or not hasattr(optim, "get"):
        return
    schedule = model.get("schedule") or optim.get("schedule")  # the deprecated flat key first, as LitTransformer
    if schedule in ("cosine", "wsd") and not (model.get("schedule_steps") or optim.get("schedule_steps")):
        steps = config.trainer.get("max_steps")
        if steps in (None, -1, 0):  # other values are Lightning's to judge (lightning_refusals)
            epochs = config.trainer.get("max_epochs")
            why = (
                f" (trainer.max_epochs {epochs} is not read: Lightning's estimated_stepping_batches breaks mid-epoch "
                "resume, Lightning issue #20550)"
                if epochs not in (None, -1)
                else ""
            )
            raise ConfigError(
                f"model.optim.schedule {schedule} decays over the run's optimizer steps, and trainer.max_steps is not "
                f"set{why}: give --trainer.max_steps N (or --model.optim.schedule_steps N)",
                keys=["model.optim.schedule", "trainer.max_steps"] + (["trainer.max_epochs"] if why else []),
            )


def log_evaluation_beside_training(config, subcommand: str | None) -> None:
    """validate, test and predict log to <run folder>/tensorboard/<command> (TensorBoard's `version`), not to a new
    version_N: the training runs keep their numbers, so version_0 stays the first fit's (and its tokenizer.json)."""
    if subcommand in (None, "fit"):
        return
    logger = config.trainer.get("logger")
    for spec in logger if isinstance(logger, list) else [logger]:
        init_args = getattr(spec, "init_args", None)
        if str(getattr(spec, "class_path", "")).endswith("TensorBoardLogger") and init_args is not None:
            if init_args.get("version") is None:
                init_args.version = subcommand


def note_earlier_run(dirpath: str) -> None:
    """A new fit in a checkpoint folder that holds a run's last.ckpt: Lightning starts another run beside it, writing
    last-v1.ckpt (the next free name), while every page calls last.ckpt the final model. Said at the start, with the
    two other things the user may have meant, in place of Lightning's warning that the folder is not empty."""
    last = last_checkpoint(dirpath)
    if last is None:
        return
    version = 1
    while (Path(dirpath) / f"last-v{version}.ckpt").exists():
        version += 1
    rank_zero_info(
        f"note: {dirpath} holds an earlier run ({Path(last).name}); this fit starts a new one beside it, whose last "
        f"checkpoint will be last-v{version}.ckpt. To go on with the earlier run, give --ckpt_path last; for a folder "
        "of its own, --trainer.default_root_dir DIR"
    )
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")


def note_newer_run(path: str, subcommand: str) -> None:
    """A last.ckpt named by its path beside a newer last-vN.ckpt: a second fit in that folder (note_earlier_run) ended
    there, and the pages' `--ckpt_path runs/NAME/checkpoints/last.ckpt`, run after it, would score the first run's
    model without a word. Said, with the file `--ckpt_path last` picks."""
    if Path(path).name != "last.ckpt" or not Path(path).is_file():
        return
    newest = last_checkpoint(Path(path).parent)
    if newest is None or Path(newest).name == "last.ckpt":
        return
    rank_zero_info(
        f"note: {path} is the last checkpoint of the folder's earlier run; a later fit there wrote {Path(newest).name}, "
        f"which is newer: --ckpt_path last (or --ckpt_path {newest}) {subcommand}s that one"
    )


_LOADED_AT = time.time()
"""When this module was imported: before any checkpoint of this process's run was written."""


def checkpoints_line(trainer: L.Trainer) -> str | None:
    """One line naming the run's final checkpoint and its best one (by the monitored metric), or None without
    checkpointing."""
    final = best = None
    # ddp_spawn/ddp_fork train in child processes: this process's callbacks never saw a save (Lightning sends back the
    # best path only), so the final checkpoint is the newest last*.ckpt the children wrote into the folder.
    children = getattr(trainer.strategy, "_start_method", None) in ("spawn", "fork", "forkserver")
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback.last_model_path and Path(callback.last_model_path).exists():
            final = final or callback.last_model_path
        elif children and callback.save_last and callback.dirpath:
            written = last_checkpoint(callback.dirpath)  # by this run, not an earlier run's left in the folder
            final = final or (written if written and os.path.getmtime(written) >= _LOADED_AT else None)
        if callback.monitor and callback.best_model_path and Path(callback.best_model_path).is_file():
            score = callback.best_model_score
            value = f" ({callback.monitor} {float(score):.4g})" if score is not None else ""
            best = best or f"{callback.best_model_path}{value}"
    if final is None and best is None:
        if not trainer.checkpoint_callbacks:
            return None
        return "checkpoints: none written (the run ended before the first checkpoint.every_n_train_steps)"
    parts = [f"final {_relative(final)}" if final else "final: none written"]
    parts.append(f"best {_relative(best)}" if best else "best: none yet (no validation ran)")
    return "checkpoints: " + ", ".join(parts)


def _relative(path: str) -> str:
    """A path under the working folder as a relative one (as the user typed the run folder), another as it is."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _run_folder_fields(config) -> Iterator[tuple[Any, str]]:
    """The places RUN_FOLDER may stand, as (namespace, key), in one order: the loggers' save_dir, the checkpoint
    folders, predict's output file (`${trainer.default_root_dir}/preds.jsonl`, as config.yaml writes the others, was
    a folder named `${trainer.default_root_dir}` in the working folder)."""
    logger = config.trainer.get("logger")
    for spec in logger if isinstance(logger, list) else [logger]:
        init_args = getattr(spec, "init_args", None)
        if init_args is not None and "save_dir" in init_args:
            yield init_args, "save_dir"
    for group in ("checkpoint", "best_checkpoint", "preemption"):
        if config.get(group) is not None and "dirpath" in config[group]:
            yield config[group], "dirpath"
    if config.get("predictions") is not None and "output" in config.predictions:
        yield config.predictions, "output"


# The path keys a user's YAML writes with `~` or `$VAR` (no shell expands a YAML's values): cache_dir and a Hugging
# Face init_from folder were expanded where they are read, the dataset, a tokenizer file and a .ckpt init_from not.
USER_PATHS = ("data.init_args.dataset", "data.init_args.tokenizer", "data.init_args.predict_file", "model.init_from")


def expanded(path: str) -> str:
    """A path with `~` and `$VAR` expanded, as a shell does on the command line (a YAML's values reach no shell)."""
    return os.path.expanduser(os.path.expandvars(path))


def expand_user_paths(config) -> None:
    """Expand `~` and `$VAR` in the USER_PATHS keys of the parsed config, as trainer.default_root_dir is (a name of the
    hub or of a tokenizer kind has neither, and is left as it is)."""
    for key in USER_PATHS:
        value = config.get(key) if key.partition(".")[0] in config else None
        if isinstance(value, str) and "://" not in value:
            config[key] = expanded(value)


def resolve_run_folder(config) -> list[int]:
    """Put trainer.default_root_dir (the working directory when unset) wherever RUN_FOLDER stands: the logger's
    save_dir, the checkpoint folders. So `--trainer.default_root_dir DIR` alone moves logs, TensorBoard and
    checkpoints into DIR, while `--checkpoint.dirpath X` or `--trainer.logger.init_args.save_dir X` still win.
    Returns the places it filled in (their positions in _run_folder_fields), for the run's config.yaml.
    A `~` or `$VAR` in the run folder is expanded here, once, for every part of the run: Lightning expanded `~` in
    the checkpoints' folder and both in TensorBoard's, so `$HOME/runs/a` put the checkpoints in a folder named `$HOME`
    under the working folder and the logs in the home folder."""
    root = str(config.trainer.get("default_root_dir") or ".")
    if "://" not in root and root != expanded(root):
        root = config.trainer.default_root_dir = expanded(root)
    filled = []
    for position, (holder, key) in enumerate(_run_folder_fields(config)):
        value = holder[key]
        if isinstance(value, str) and RUN_FOLDER in value:
            holder[key] = value.replace(RUN_FOLDER, root)
            filled.append(position)
    return filled


class RunConfigFile(SaveConfigCallback):
    """The run's config.yaml, with the placeholder RUN_FOLDER kept where the configs left one: a file given again
    with `--trainer.default_root_dir NEW` (a rerun with another seed, say) then writes its checkpoints and TensorBoard
    logs into NEW, not into the first run's folder as last-v1.ckpt and version_1 (the resolved paths did)."""

    def __init__(self, parser: LightningArgumentParser, config: Any, *args: Any, run_folder_fields=(), **kwargs: Any):
        if run_folder_fields:
            root = str(config.trainer.get("default_root_dir") or ".")
            config = config.clone()
            for position, (holder, key) in enumerate(_run_folder_fields(config)):
                if position in run_folder_fields and isinstance(holder[key], str):
                    holder[key] = holder[key].replace(root, RUN_FOLDER, 1)
            if isinstance(parser, ValidatedOnceParser):  # the clone of a validated config is one too
                parser.trust(config)
        super().__init__(parser, config, *args, **kwargs)


# The folders that follow checkpoint.dirpath (parser links): jsonargparse refuses a flag for one in words that do not
# say so ("str | pathlib.Path is not callable") and drops a YAML's value in silence.
LINKED_FOLDERS = ("best_checkpoint.dirpath", "preemption.dirpath")


def check_linked_folders(argv: Sequence[str]) -> None:
    """A folder of the run's checkpoints other than checkpoint.dirpath, given by a flag or a config, is refused: the
    best and the preemption checkpoints are written beside last.ckpt, in checkpoint.dirpath, which `--ckpt_path last`
    and `best` read."""
    given = [key for key in LINKED_FOLDERS if given_where([key], argv) is not None]
    if given:
        raise ConfigError(
            f"{' and '.join(given)} cannot be set: the best and the preemption checkpoints are written beside "
            "last.ckpt, in checkpoint.dirpath (where --ckpt_path last and best find them). Drop "
            f"{'it' if len(given) == 1 else 'them'}, and move all the checkpoints with --checkpoint.dirpath DIR",
            keys=given,
        )


def claim_tensorboard_version(trainer: L.Trainer) -> None:
    """Take the TensorBoard logger's next version_N by creating its folder, which only one process can do. Lightning
    picks the next number from a listing and creates the folder later: two fits started together in one run folder
    (a job array of seeds) both took version_0, merging their curves into one run and leaving one config.yaml."""
    from lightning.pytorch.loggers import TensorBoardLogger

    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if not isinstance(logger, TensorBoardLogger) or logger._version is not None or "://" in str(logger.root_dir):
            continue
        root, version = Path(expanded(logger.root_dir)), logger._get_next_version()
        root.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                (root / f"version_{version}").mkdir()
                break
            except FileExistsError:  # another process took it after the listing
                version += 1
        logger._version = version


def _default(owner: Callable | type, name: str) -> object:
    if dataclasses.is_dataclass(owner):
        field = {f.name: f for f in dataclasses.fields(owner)}.get(name)
        return field.default if field is not None else inspect.Parameter.empty
    parameter = inspect.signature(owner).parameters.get(name)
    return parameter.default if parameter is not None else inspect.Parameter.empty


def check_task_and_data(config) -> None:
    """A given model.task against the tasks the data's DataModule feeds, from the configs alone: the data is read when
    the DataModule is built (its tokenizer, for the vocabulary size), so a mismatch was refused for whatever that
    reading met first (a translation preset's Bible read as a language model's text: "no column 'text'"). A task
    that comes from the architecture is judged once the model is built, so that the architecture's own mistakes
    (topology encoder_decoder with positions none) are named first; a --ckpt_path checkpoint's task was judged as
    the file was read."""
    data_class, model = _data_class(config.get("data")), config.get("model")
    if data_class is None or model is None or not hasattr(data_class, "check_task"):
        return

    def plain(value):
        return value.as_dict() if isinstance(value, jsonargparse.Namespace) else value

    spec = plain(model.get("task"))
    if not spec:  # the architecture's task: judged once the model is built, after the architecture's own checks
        return
    task = task_class_of({"task": spec})
    if task is not None:
        data_class.check_task(task.name, task.__name__)


def link_context_length(config, subcommand: str | None) -> None:
    """The model's context (model.config.max_seq_len) and the data's (data.init_args.block_size, where the data has
    one) are one value: the one given sets the other; given both, `fit` needs them equal. (validate/test may read
    longer blocks than the model was trained on: that is how length extrapolation is measured.) The data's
    block_size defaults to None, so any value given, the model's default 256 included, counts as given; the model's
    context counts as given when it differs from TransformerConfig's default."""
    from lit_transformer.config import TransformerConfig

    data, model = config.get("data"), config.get("model")
    init_args = getattr(data, "init_args", None)
    if init_args is None or "block_size" not in init_args or model is None or model.get("config") is None:
        return
    block, context = init_args.block_size, model.config.max_seq_len
    block_given = block is not None
    context_given = context != _default(TransformerConfig, "max_seq_len")
    if not block_given:
        init_args.block_size = context
    elif not context_given:
        model.config.max_seq_len = block
    elif block != context and subcommand == "fit" and config.get("ckpt_path"):  # the context is the checkpoint's
        path = config.ckpt_path
        weights = "PATH.ckpt" if path in ("last", "best", "hpc", "registry") else path
        raise ConfigError(
            f"fit --ckpt_path {path} resumes a model whose context is {context} tokens (its model.config.max_seq_len), "
            f"and data.init_args.block_size={block} would train it on blocks of another length: resume with "
            f"block_size {context} (or leave it unset), or train on {block} in a new run that starts from its weights "
            f"(--model.init_from {weights}, without --ckpt_path)",
            keys=["data.init_args.block_size", "ckpt_path"],
        )
    elif block != context and subcommand == "fit":
        raise ConfigError(
            f"data.init_args.block_size={block} and model.config.max_seq_len={context} disagree: the model trains on "
            "blocks of its context length. Give one of them (the other follows) or the same value to both",
            keys=["data.init_args.block_size", "model.config.max_seq_len"],
        )


def _trainer_defaults() -> dict:
    # Every checkpoint is written atomically: a crash at any moment leaves the previous one loadable.
    return {
        "callbacks": [LearningRateLogger()],
        # TensorBoard in <run folder>/tensorboard/version_N (resolve_run_folder fills in the run folder).
        "logger": {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": RUN_FOLDER, "name": "tensorboard"},
        },
        # A class path, not an instance: the run's saved config.yaml can name it (an instance is "Unable to serialize").
        "plugins": [{"class_path": f"{AtomicCheckpointIO.__module__}.{AtomicCheckpointIO.__qualname__}"}],
    }


def run_cli(args: Sequence[str] | None = None, run: bool = True) -> TransformerCLI:
    """The command line's LightningCLI; with run=False its objects (model, data, trainer) are built, not fitted.
    Keys are exact (no abbreviation) and a parse error raises a UserError (arguments.refusal). Given `args` (a
    benchmark building the CLI's objects in its own process), packaged configs are found by name as the command line
    finds them, from any folder."""
    if args is not None:
        args = resolve_configs(args)
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")  # args are the point
    argv = list(sys.argv[1:] if args is None else args)
    options = parser_options(program())
    if argv and argv[0] in LightningCLI.subcommands():  # the command's own parser: its usage line says its name
        usage = f"{program(argv[0])} [--config FILE_OR_NAME ...] [--KEY VALUE ...]"
        summary = next(c.summary for c in COMMANDS if c.name == argv[0])
        options[argv[0]] = parser_options(program(argv[0]), description=summary, usage=usage)
    return TransformerCLI(
        LitTransformer,
        L.LightningDataModule,
        subclass_mode_data=True,
        trainer_defaults=_trainer_defaults(),
        save_config_kwargs={"overwrite": True},
        parser_kwargs=options,
        args=args,
        auto_configure_optimizers=False,
        run=run,
    )


def _subcommand_parser(parser, name: str | None):
    """The parser of one subcommand (fit, ...) under LightningCLI's main parser, for the keys it takes."""
    for action in parser._actions:  # argparse keeps its subparsers action there; it has no public accessor
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict) and name in choices:
            return choices[name]
    return None


# Help text of the package's own defaults, where Lightning's docstring describes another default.
PACKAGE_HELP = {
    "checkpoint.dirpath": "Folder of last.ckpt (written every checkpoint.every_n_train_steps steps) and the best "
    "checkpoint; by default <trainer.default_root_dir>/checkpoints.",
    "checkpoint.every_n_train_steps": "Write last.ckpt every N optimizer steps, whatever the metrics.",
    "best_checkpoint.dirpath": "Folder of the best checkpoint: always checkpoint.dirpath (set that one).",
    "best_checkpoint.monitor": "The metric that selects the best checkpoint: val/nll (the validation split's "
    "per-token negative log-likelihood), or val/bleu with best_checkpoint.mode max for translation.",
    "checkpoint.filename": "File name of the periodic checkpoint besides last.ckpt (with checkpoint.save_top_k > 0), "
    "a pattern such as step{step:06d}.",
    "best_checkpoint.filename": "File name of the best checkpoint, a pattern of the step and metrics.",
    "preemption.dirpath": "Folder of the checkpoint written on SIGTERM/SIGINT: always checkpoint.dirpath (set that "
    "one).",
    "trainer.default_root_dir": "The run folder: TensorBoard logs go to its tensorboard/, checkpoints to its "
    "checkpoints/, predictions to its predictions.jsonl (default: the working folder).",
    "trainer.logger": "The logger: by default TensorBoard in <trainer.default_root_dir>/tensorboard; false turns "
    "logging (and the callbacks that log) off.",
    "weights_only": "Checkpoints are always read with torch.load(weights_only=True), so a file never runs code; the "
    "package's own plain types are allowed by name (false is not honoured).",
    "ckpt_path": "The checkpoint: a .ckpt file, or last (the newest last*.ckpt of the run folder's checkpoints/, "
    "i.e. checkpoint.dirpath's: last.ckpt, or the last-v1.ckpt of a second run there) or best (the best checkpoint by best_checkpoint.monitor that that last.ckpt records). fit "
    "resumes it (last with no last.ckpt yet starts a new run there); validate, test and predict score it, and refuse "
    "to run without one (or --model.init_from): nothing untrained is scored.",
    "trainer.enable_checkpointing": "false turns the package's checkpoint callbacks (checkpoint, best_checkpoint, "
    "preemption) off.",
    "data": "The DataModule: --data.class_path (lit_transformer.data.LanguageModelingDataModule, "
    "TranslationDataModule, ClassificationDataModule or CaptioningDataModule) and its --data.init_args.KEY VALUE; "
    "--data.help CLASS_PATH lists one's init_args keys, e.g. fit --data.help "
    "lit_transformer.data.LanguageModelingDataModule.",
}


def describe_package_defaults(parser) -> None:
    """fit --help as a user needs it: the package's defaults described as they are, deprecated keys hidden (they are
    still accepted, each with a FutureWarning naming its new key)."""
    import argparse

    from lit_transformer.engine.deprecated_options import DEPRECATED_NAMES

    hidden = {f"model.{name}" for name in DEPRECATED_NAMES}
    for action in parser._actions:  # argparse keeps the options there; help is set on each action
        if action.dest in hidden:
            action.help = argparse.SUPPRESS
        elif action.dest in PACKAGE_HELP:
            action.help = PACKAGE_HELP[action.dest]


LOGGING_CALLBACKS = (LearningRateLogger, GenerateSamples, AttentionMaps, TokenThroughputMonitor)
CHECKPOINT_CALLBACKS = (ModelCheckpoint, PreemptionCheckpoint)


def switched_off(config: dict, callbacks: list) -> tuple[dict, list]:
    """Lightning's switches mean what they say: `trainer.enable_checkpointing false` drops the package's own
    checkpoint callbacks (Lightning refuses a ModelCheckpoint beside it), and `trainer.logger false` the callbacks
    that only log (a LearningRateMonitor without a logger fails)."""
    drop: tuple[type, ...] = ()
    if config.get("enable_checkpointing") is False:
        drop += CHECKPOINT_CALLBACKS
    if config.get("logger") is False:
        drop += LOGGING_CALLBACKS
    if not drop:
        return config, callbacks
    given = config.get("callbacks")
    if isinstance(given, list):
        config = {**config, "callbacks": [c for c in given if not isinstance(c, drop)]}
    elif isinstance(given, drop):
        config = {**config, "callbacks": None}
    return config, [c for c in callbacks if not isinstance(c, drop)]


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler to whatever sys.stderr is when a record is emitted, not when the handler was made: the program
    run in-process with stderr redirected (a test, a notebook cell) must not leave a handler bound to a stream that is
    closed later (the next record would end in "--- Logging error --- I/O operation on closed file")."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns one; sys.stderr is read at each record instead
        pass


def show_package_info_logs() -> None:
    """Let the package's INFO records reach stderr, as Lightning's own do, unless logging was configured already.

    Without it `fit` prepares a big corpus in silence wherever stderr is not a terminal (a log file, nohup, a batch
    job: the progress bars are off there): the per-split summaries of the preparation (MB, MB/s, tokens, tokens/s)
    and its "resuming after shard N" went nowhere, while `prepare` printed them.
    """
    logger = logging.getLogger("lit_transformer")
    if logger.handlers or logger.level != logging.NOTSET or logging.getLogger().hasHandlers():
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def lightning_main(argv: Sequence[str]) -> None:
    """fit, validate, test or predict (argv[0]): glibc's malloc keeping freed memory (engine/host_allocator.py),
    packaged configs found by name, the package's logs shown, a signal before the first step ending the run at once."""
    keep_freed_memory()  # before the run allocates: each step reuses the memory the step before it freed
    argv = resolve_configs(argv)
    quiet_dependencies()
    show_package_info_logs()
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    with exit_on_signals():  # a signal before the first step ends the run at once (nothing to save yet)
        run_cli(argv)
