"""More than one machine, tested on one: two nodes of one process each, DDP over gloo on loopback addresses.

Each node is its own launch, as on a cluster: with Lightning's variables (MASTER_ADDR, MASTER_PORT, NODE_RANK), with
SLURM's (what srun sets), and with torchrun (torch's elastic launcher), for the language model and the translation
model of the tiny presets. Both nodes share one data cache, which they prepare at the same moment, and one
checkpoint folder. A lost node (killed, or stopped) ends the other with one line; torchrun restarts a killed worker
and the run goes on from its last checkpoint; a run resumes across node counts on the same global sample sequence.
Every command of docs/clusters.md is parsed here.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import psutil
import pytest
import torch
import yaml

TESTS = Path(__file__).parent
REPO = TESTS.parent
DOCS = REPO / "docs" / "clusters.md"
sys.path.insert(0, str(TESTS))
import _samples  # noqa: E402
from _forked import HARNESS_ENV, WarmProcess, warm_python  # noqa: E402

BATCH = 8
TIMEOUT_S = 180  # a bound for a whole launch (pytest's timeout is 600 s a test); a healthy one takes seconds
ENV = dict(HARNESS_ENV)
for _name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
    ENV.pop(_name, None)
for _name in [n for n in ENV if n.startswith(("SLURM_", "TORCHELASTIC_"))]:
    ENV.pop(_name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(run: Path, cache: Path, max_steps: int, *callbacks: dict, every: int = 2) -> Path:
    """A YAML of the run's own settings (over a preset): few steps, a checkpoint every `every`, recorders."""
    config = {
        "trainer": {
            "default_root_dir": str(run),
            "max_steps": max_steps,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "logger": False,
            "accelerator": "cpu",
            "callbacks": list(callbacks),
            "plugins": [{"class_path": "_nodes.RecordedCheckpointIO", "init_args": {"log": str(run / "saves.jsonl")}}],
        },
        "data": {"init_args": {"cache_dir": str(cache)}},
        "checkpoint": {"dirpath": str(run / "ckpt"), "every_n_train_steps": every},
    }
    run.mkdir(parents=True, exist_ok=True)
    path = run / f"run-{max_steps}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cli(preset: str, config: Path, nodes: int, *extra: str) -> list[str]:
    """The CLI's arguments (after `python -m lit_transformer`)."""
    return ["fit", "--config", f"configs/presets/{preset}.yaml", "--config", str(config),
            "--trainer.num_nodes", str(nodes), "--trainer.devices", "1", *extra]  # fmt: skip


def lightning_nodes(args: list[str], nodes: int = 2) -> list[tuple[list[str], dict]]:
    """One launch per node with Lightning's own variables."""
    port = str(free_port())
    base = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return [([sys.executable, "-m", "lit_transformer", *args], {**base, "NODE_RANK": str(n)}) for n in range(nodes)]


def slurm_nodes(args: list[str]) -> list[tuple[list[str], dict]]:
    """One launch per node with the variables srun sets for a job of 2 nodes x 1 task (no srun on this host)."""
    job = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "127.0.0.1", "SLURM_NNODES": "2",
           "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_LOCALID": "0", "MASTER_PORT": str(free_port())}  # fmt: skip
    return [
        (
            [sys.executable, "-m", "lit_transformer", *args],
            {**ENV, **job, "SLURM_PROCID": str(n), "SLURM_NODEID": str(n)},
        )
        for n in range(2)
    ]


def torchrun_nodes(args: list[str], restarts: int = 0) -> list[tuple[list[str], dict]]:
    """One torchrun per node: the c10d rendezvous (a fresh store each restart) when it may restart, else static."""
    port = str(free_port())
    launches = []
    for n in range(2):
        run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
        if restarts:
            run += ["--max-restarts", str(restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
            run += ["--rdzv-id", "test", "--monitor-interval", "0.2"]
        else:
            run += ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", port]
        env = {**ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        launches.append(([*run, "-m", "lit_transformer", *args], env))
    return launches


@contextlib.contextmanager
def launched(launches: list[tuple[list[str], dict]], logs: Path) -> Iterator[list[subprocess.Popen | WarmProcess]]:
    """Start every launch at once (their output to logs/node<N>.log); whatever is left is killed on the way out,
    torchrun's workers (in sessions of their own) included. Each launch, the CLI's own (`python -m lit_transformer`)
    or torchrun, is a process forked from a warm interpreter (tests/_forked.py), and so is each worker torchrun starts
    (`python -u -m lit_transformer`, each attempt's): still a process of its own, torchrun's child, which it watches,
    kills and restarts as it would a fresh one; only the seconds of importing torch and Lightning go."""
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen | WarmProcess] = []
    try:
        for n, (command, env) in enumerate(launches):
            start = warm_python(ENV).popen
            with open(logs / f"node{n}.log", "w") as log:
                procs.append(
                    start(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                )
        yield procs
    finally:
        left = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                left += [proc, *psutil.Process(proc.pid).children(recursive=True)]
        for victim in left:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                victim.kill()
        for proc in procs:
            proc.wait(timeout=30)


def wait_all(procs: list[subprocess.Popen | WarmProcess], timeout: float = TIMEOUT_S) -> list[int]:
    deadline = time.monotonic() + timeout
    return [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]


def logs_of(logs: Path) -> list[str]:
    return [path.read_text() for path in sorted(logs.glob("node*.log"))]


def run_nodes(launches: list[tuple[list[str], dict]], logs: Path) -> list[str]:
    with launched(launches, logs) as procs:
        codes = wait_all(procs)
    texts = logs_of(logs)
    assert codes == [0] * len(launches), "\n".join(text[-3000:] for text in texts)
    return texts


def prepared_once(texts: list[str], root: Path, splits: tuple[str, ...] = ("train", "validation", "test")) -> None:
    """The nodes prepared the cache once between them: one preparation log line per split in all their output, one
    prepared dataset (its manifest written last), no temporary file left."""
    lines = [line for text in texts for line in text.splitlines() if re.match(r"prepare \w+", line)]
    assert sorted(line.split()[1].rstrip(":") for line in lines) == sorted(splits), lines
    assert len(list(root.rglob("manifest.json"))) == 1
    assert not list(root.rglob("*.tmp"))


def saves(run: Path) -> list[tuple[int, int, str]]:
    """(rank, step, file) of every checkpoint written, in order."""
    rows = [json.loads(line) for line in (run / "saves.jsonl").read_text().splitlines()]
    return [(row["rank"], row["step"], row["file"]) for row in rows]


def lm_reference(cache: Path, samples: int) -> dict[int, str]:
    """Global sample index -> digest of its tokens, as one uninterrupted process reads the training stream of the
    tiny preset (the digest of tests/_samples.py's SampleRecorder)."""
    import hashlib

    from lit_transformer.data import LanguageModelingDataModule

    init_args = yaml.safe_load((REPO / "configs/presets/tiny.yaml").read_text())["data"]["init_args"]
    datamodule = LanguageModelingDataModule(**{**init_args, "cache_dir": str(cache)})
    datamodule.setup("fit")
    digests: dict[int, str] = {}
    for batch in datamodule.train_dataloader():
        tokens = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()
        for index, sample in zip(batch["sample_index"].tolist(), tokens, strict=True):
            digests[index] = hashlib.sha1(sample.tobytes()).hexdigest()[:16]
        if len(digests) >= samples:
            return digests
    raise AssertionError(f"the training stream ended before {samples} samples")


def recorder(kind: str, path: Path) -> dict:
    return {"class_path": f"_samples.{kind}", "init_args": {"path": str(path)}}


def lose(step: int, how: str = "SIGKILL") -> dict:
    return {"class_path": "_nodes.LoseRank", "init_args": {"step": step, "rank": 1, "signal": how}}


pytestmark = pytest.mark.slow


def test_two_nodes_prepare_once_checkpoint_once_and_resume_on_one_node_and_on_two(tmp_path: Path) -> None:
    """Language model. 2 nodes (Lightning's variables) to step 4 from an empty cache, which both prepare at once;
    resumed on 1 node to step 6; resumed on 2 nodes under torchrun to step 8. Every step trains the next samples of
    one global stream, each sample once, with the tokens one uninterrupted process reads there."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    samples = recorder("SampleRecorder", run / "samples")
    texts = run_nodes(lightning_nodes(cli("tiny", run_config(run, cache, 4, samples), 2)), tmp_path / "a")
    prepared_once(texts, cache)
    assert saves(run) == [(0, 2, "last.ckpt"), (0, 4, "last.ckpt")]  # each written once, by global rank 0
    run_nodes([([sys.executable, "-m", "lit_transformer", *cli("tiny", run_config(run, cache, 6, samples), 1),
                 "--ckpt_path", "last"], ENV)], tmp_path / "b")  # fmt: skip
    run_nodes(
        torchrun_nodes([*cli("tiny", run_config(run, cache, 8, samples), 2), "--ckpt_path", "last"]), tmp_path / "c"
    )
    assert saves(run)[2:] == [(0, 6, "last.ckpt"), (0, 8, "last.ckpt")]

    rows = _samples.read_samples(run / "samples")
    expected: list[int] = []
    for step, ranks in zip(range(1, 9), [2, 2, 2, 2, 1, 1, 2, 2], strict=True):
        assert sorted(r["rank"] for r in rows if r["step"] == step) == list(range(ranks)), step
        at_step = sorted(s for r in rows if r["step"] == step for s in r["samples"])
        assert at_step == list(range(len(expected), len(expected) + BATCH * ranks)), step  # the next samples
        expected += at_step
    read = {s: t for r in rows for s, t in zip(r["samples"], r["tokens"], strict=True)}
    assert len(read) == sum(len(r["samples"]) for r in rows)  # none read twice
    reference = lm_reference(cache, len(expected))
    assert read == {s: reference[s] for s in expected}  # no node read other tokens (nor a half-written shard)


def test_torchrun_restarts_a_killed_translation_worker_and_the_run_goes_on_from_its_last_checkpoint(
    tmp_path: Path,
) -> None:
    """Translation under torchrun --max-restarts 1, from an empty cache both nodes prepare at once. Rank 1 is
    killed after step 3 (the last checkpoint: step 2); torchrun restarts both workers, which resume from it by
    themselves and train steps 3 and 4 on the very batches of the first attempt."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    batches = recorder("BatchRecorder", run / "batches")
    config = run_config(run, cache, 4, batches, lose(3))
    texts = run_nodes(torchrun_nodes(cli("tiny-translate", config, 2), restarts=1), tmp_path / "logs")
    prepared_once(texts, cache)
    assert "Traceback" not in "".join(texts)
    # The survivor's line (unless its agent's SIGTERM, on the way to the restart, ended it first) says what follows.
    lines = [line for text in texts for line in text.splitlines() if line.startswith("Lost rank")]
    assert all(re.match(r"Lost rank 1 \(node \d\) of 2 at step 3: .* torchrun restarts the workers", x) for x in lines)
    assert any("resuming from" in t and "last.ckpt" in t for t in texts)
    assert saves(run) == [(0, 2, "last.ckpt"), (0, 4, "last.ckpt")]
    assert torch.load(run / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 4
    rows = _samples.read_samples(run / "batches")
    for rank in (0, 1):
        steps = [r["step"] for r in rows if r["rank"] == rank]
        assert steps == [1, 2, 3, 3, 4], (rank, steps)  # the first attempt to step 3, the second from step 2
        third = [r["batch"] for r in rows if r["rank"] == rank and r["step"] == 3]
        assert third[0] == third[1]  # step 3 again on the same batch


def test_a_node_that_dies_ends_the_other_with_one_line_naming_it_and_how_to_resume(tmp_path: Path) -> None:
    """Translation, 2 nodes with Lightning's variables, from an empty cache both prepare at once; rank 1 is killed
    after step 3: rank 0 ends with one line (no traceback) that names it and says how to resume."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    launches = lightning_nodes(cli("tiny-translate", run_config(run, cache, 8, lose(3)), 2))
    with launched(launches, tmp_path / "logs") as procs:
        assert wait_all(procs) == [1, -signal.SIGKILL]
    prepared_once(logs_of(tmp_path / "logs"), cache)
    assert saves(run) == [(0, 2, "last.ckpt")]
    survivor = logs_of(tmp_path / "logs")[0]
    assert "Traceback" not in survivor and "Connection reset" not in survivor, survivor[-3000:]
    line = survivor.strip().splitlines()[-1]
    assert re.fullmatch(
        r"Lost rank 1 \(node 1\) of 2 at step 3: its connection closed \(the process or its node died\)\. "
        rf"To resume from {re.escape(str(run / 'ckpt' / 'last.ckpt'))}, run the same command again on every node "
        r"with --ckpt_path last\.",
        line,
    ), line
    documented = re.search(r"```text\n(Lost rank .*)\n```", DOCS.read_text()).group(1)
    assert re.sub(r"from \S+,", "from X,", documented) == re.sub(r"from \S+,", "from X,", line)  # as the docs show


def test_a_hung_node_ends_the_others_within_the_collective_timeout(tmp_path: Path, lm_cache: Path) -> None:
    """Launched as srun launches (SLURM's variables); rank 1 stops itself (SIGSTOP) after step 3: it closes no
    connection, and rank 0 gives up after --collective_timeout seconds, not torch's 30 minutes."""
    run = tmp_path / "run"
    args = cli("tiny", run_config(run, lm_cache, 8, lose(3, "SIGSTOP")), 2, "--collective_timeout", "3")
    with launched(slurm_nodes(args), tmp_path / "logs") as procs:
        assert procs[0].wait(timeout=TIMEOUT_S) == 1
        assert psutil.Process(procs[1].pid).status() == psutil.STATUS_STOPPED
    survivor = logs_of(tmp_path / "logs")[0]
    assert "Traceback" not in survivor, survivor[-3000:]
    assert re.fullmatch(
        r"Lost rank 1 \(node 1\) of 2 at step 3: no answer within the collective timeout \(--collective_timeout 3 s\): "
        r"it hung, was stopped or is unreachable\. To resume from \S+last\.ckpt, run the same command again on every "
        r"node with --ckpt_path last\.",
        survivor.strip().splitlines()[-1],
    )


@pytest.fixture(scope="module")
def lm_cache(tmp_path_factory) -> Path:
    """The tiny language model's data, prepared once in this process for the tests that are not about preparing."""
    from lit_transformer.data import LanguageModelingDataModule

    cache = tmp_path_factory.mktemp("lm-cache")
    init_args = yaml.safe_load((REPO / "configs/presets/tiny.yaml").read_text())["data"]["init_args"]
    LanguageModelingDataModule(**{**init_args, "cache_dir": str(cache)}).prepare()
    return cache


# ---------------------------------------------------------------------------------------------------- the docs


def docs_commands() -> list[str]:
    """The commands of docs/clusters.md's bash blocks, comment lines dropped (an sbatch script's #SBATCH lines are
    read by test_every_command_of_the_clusters_page_parses)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip() and line[0] != "#"]


class Parsed(Exception):
    pass


def parse(words: list[str]) -> str:
    """Parse the arguments of `python -m lit_transformer WORDS` with the CLI's own parsers, in this process, and stop
    there; the resolved config (fit: --print_config) or ''."""
    import jsonargparse

    from lit_transformer.cli.lightning_cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
        if words[0] == "prepare":  # its parsers parse every flag; it stops before building the DataModule
            with mock.patch.object(jsonargparse.ArgumentParser, "instantiate_classes", side_effect=Parsed):
                with pytest.raises(Parsed):
                    main(words)
            return ""
        with pytest.raises(SystemExit) as exit_:
            main([*words, "--print_config"] if "--print_config" not in words else words)
    assert exit_.value.code in (0, None), f"{shlex.join(words)}: {err.getvalue()[-2000:]}"
    return out.getvalue()


def lit_transformer_words(command: str) -> tuple[list[str], dict[str, str], list[str]]:
    """(the launcher's words, the variables set before it, the words after `lit_transformer`) of a command."""
    words = shlex.split(command.partition("  #")[0])
    env = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    at = words.index("lit_transformer")
    return words[: at - 1], env, words[at + 1 :]


def test_every_command_of_the_clusters_page_parses() -> None:
    """Each launcher's own parser takes its flags (torchrun's; srun's and sbatch's settings agree with the CLI's),
    each lit_transformer command parses with the CLI's, and what the page says a flag does, it does."""
    from torch.distributed.run import get_args_parser

    commands = docs_commands()
    launchers = {lit_transformer_words(c)[0][0] for c in commands if "lit_transformer" in c}
    assert launchers == {"python", "srun", "torchrun"}, launchers
    assert [c for c in commands if "lit_transformer" not in c] == ["source .venv/bin/activate"]
    for command in (c for c in commands if "lit_transformer" in c):
        launcher, env, words = lit_transformer_words(command)
        config = parse(words)
        if words[0] != "fit":
            continue
        resolved = yaml.safe_load(config)
        nodes, devices = resolved["trainer"]["num_nodes"], int(resolved["trainer"]["devices"])
        assert nodes == 2, command
        if launcher[0] == "torchrun":
            args = get_args_parser().parse_args([*launcher[1:], "-m", "lit_transformer", *words])
            assert (args.nnodes, int(args.nproc_per_node), args.module) == ("2", devices, True), command
            assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in env) == (args.max_restarts > 0), command
        elif launcher[0] == "srun":
            script = DOCS.read_text()
            assert f"#SBATCH --nodes={nodes}\n" in script and f"#SBATCH --ntasks-per-node={devices}\n" in script
        else:
            assert set(env) in ({"MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}, set()), command
            assert set(env) or "--print_config" in command, command
        if "--collective_timeout" in words:
            assert resolved["collective_timeout"] == float(words[words.index("--collective_timeout") + 1])
    default = yaml.safe_load(parse(["fit", "--config", "configs/presets/tiny.yaml"]))["collective_timeout"]
    assert f"`--collective_timeout` seconds (default {default:g}" in DOCS.read_text()


def test_a_fit_under_torchrun_with_restarts_resumes_from_the_last_checkpoint_if_there_is_one(
    tmp_path: Path, monkeypatch
) -> None:
    from lit_transformer.engine.devices import resume_after_restart

    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # a node restarted because another left keeps count 0
    assert resume_after_restart(None, tmp_path) is None  # no checkpoint yet: a new run
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert resume_after_restart(None, tmp_path) == "last"
    assert resume_after_restart("other.ckpt", tmp_path) == "other.ckpt"  # what the command asks for wins
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert resume_after_restart(None, tmp_path) is None  # torchrun without restarts: as the command says


def test_fit_restarted_by_torchrun_finds_last_ckpt_in_the_default_run_folder(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """The command's wiring, not only the function: with the checkpoint folder left at its default (under
    trainer.default_root_dir), a fit restarted under --max-restarts resumes from that folder's last.ckpt."""
    from test_cli import _cli

    from lit_transformer.checkpoints.files import load_checkpoint

    common = ["fit", "--config", str(REPO / "configs/presets/tiny.yaml"), "--trainer.default_root_dir", str(tmp_path),
              "--trainer.logger", "false", "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
              "--trainer.enable_progress_bar", "false", "--checkpoint.every_n_train_steps", "1"]  # fmt: skip
    _cli(*common, "--trainer.max_steps", "2", cwd=tmp_path)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with caplog.at_level("INFO"):
        _cli(*common, "--trainer.max_steps", "3", cwd=tmp_path)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert f"resuming from {last} (--ckpt_path last)" in caplog.text
    assert f"Restored all states from the checkpoint at {last}" in caplog.text
    assert load_checkpoint(last)["global_step"] == 3


def test_with_more_than_two_ranks_the_lost_ones_are_those_that_do_not_check_in(monkeypatch) -> None:
    """Rank 0 of 4, where ranks 2 checked in (and read its answer) and 1 and 3 never do: 1 and 3 are named; a store
    that does not answer (its host is gone) gives None."""
    import threading

    from torch.distributed import TCPStore, distributed_c10d

    from lit_transformer.engine.devices import _PROBE, _silent_ranks

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    store.set(f"{_PROBE}/2", "1")
    threading.Timer(0.3, lambda: store.set(f"{_PROBE}/2/done", "1")).start()
    assert _silent_ranks(0, 4, probe_s=1.0) == [1, 3]

    def gone():
        raise RuntimeError("Connection refused")

    monkeypatch.setattr(distributed_c10d, "_get_default_store", gone)
    assert _silent_ranks(1, 4, probe_s=1.0) is None
