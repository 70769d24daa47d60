"""Every ```bash block of every page reads as the shell reads it, and its `lit_transformer` commands are ones a reader can
run: each parses with the CLI's own parser, and each path it reads is in the repository, made by an earlier command
of the page (or of the README, which every page follows), or named as the reader's own.

A block is checked as bash sees it (`bash -n`), and then line by line with continuation lines joined: each line splits
into words (shlex, as the shell quotes them) and starts with a command, not an option (a line `--model.lora.rank 16`
after a line that does not end in a backslash is a command of its own to bash, and fails when run). The commands of
the pages that tests/test_readme.py, test_lora.py, test_own_data.py and test_multinode.py run or parse already are
parsed there (PARSED_ELSEWHERE); the others are parsed here, and so are the package's commands that are not the
CLI's (`bench NAME`, `ablate`, ...: each by its own parser) on the pages test_readme.py does not run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from test_readme import PAGES as README_RUN
from test_readme import page_commands, parse_only

from lit_transformer.cli.arguments import resolve_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *[ROOT / n for n in ("CONTRIBUTING.md",) if (ROOT / n).is_file()]]
PAGES += sorted((ROOT / "docs").glob("*.md"))
# Pages whose lit_transformer commands another test parses with the CLI's parsers (and runs, for test_readme).
PARSED_ELSEWHERE = {
    "README.md": "test_readme.py",
    "docs/results.md": "test_readme.py",
    "docs/translation.md": "test_readme.py",
    "docs/inference.md": "test_readme.py",
    "docs/scaling.md": "test_readme.py",
    "docs/troubleshooting.md": "test_readme.py",
    "docs/finetuning.md": "test_lora.py",
    "docs/data.md": "test_own_data.py",
    "docs/clusters.md": "test_multinode.py",
}
# Flags whose value is a path the command reads.
READS = (
    "--config", "--ckpt_path", "--checkpoint", "--checkpoints", "--model.init_from", "--base", "--prompt_file",
    "--data.init_args.dataset", "--data.init_args.tokenizer", "--data.init_args.predict_file",
)  # fmt: skip
# Flags whose value is a path the command writes (so a later command may read it).
WRITES = (
    "--out", "--output", "--json", "--trainer.default_root_dir", "--checkpoint.dirpath", "--data.init_args.cache_dir",
    "--predictions.output",
)  # fmt: skip
# A path the page names as the reader's own: my_*, your_*, placeholders in capitals, a checkout beside this one.
OWN = re.compile(r"(^|/)(my_|your_)|^[A-Z][A-Z_]*(/|$)|^X\.yaml$|^\.\./|^/mnt/|^/shared/")


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def bash_blocks(page: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def logical_lines(block: str) -> list[str]:
    """The block's commands as the shell joins them: continuation lines joined, blank and comment lines dropped."""
    joined = re.sub(r"\\\n", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def lit_transformer_command(line: str) -> str | None:
    """A line that runs the CLI, as `python -m lit_transformer ...` (launchers and variables set before it dropped)."""
    words = shlex.split(line, comments=True)
    if "lit_transformer" not in words or words[words.index("lit_transformer") - 1] != "-m":
        return None
    return shlex.join(["python", "-m", "lit_transformer", *words[words.index("lit_transformer") + 1 :]])


def flag_values(words: list[str], flags: tuple[str, ...]) -> list[str]:
    values = []
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in flags:
            values.append(value if eq else words[i + 1] if i + 1 < len(words) else "")
    return values


def trains_then_scores(words: list[str]) -> bool:
    """`bench nanogpt ... ours`: runs fit on its config, then reads the checkpoint that fit wrote."""
    return "nanogpt" in words and "ours" in words


def made_by(words: list[str]) -> list[str]:
    """The paths a command writes: its output flags, `> file`, and the run folder of a command that trains (fit, and
    `bench nanogpt ... ours`, which runs fit on its config and then scores the checkpoint it wrote)."""
    made = flag_values(words, WRITES)
    made += [words[i + 1] for i, w in enumerate(words[:-1]) if w in (">", ">>")]
    if "fit" in words or trains_then_scores(words):
        for config in flag_values(words, ("--config",)):
            path = ROOT / config
            if path.is_file():
                root = ((yaml.safe_load(path.read_text()) or {}).get("trainer") or {}).get("default_root_dir")
                made += [root] if root else []
    return [m.rstrip("/") for m in made if m]


def unmade_reads(pages: list[Path]) -> list[str]:
    """Paths that a lit_transformer command of the last page reads and that nothing before it makes (the commands of
    the README's bash blocks and task table, then the page's, in reading order)."""
    made: list[str] = []
    missing = []
    for page in pages:
        for command in page_commands(page.read_text()):
            line = command.partition("  #")[0].strip()
            words = shlex.split(line, comments=True)
            own_run = made_by(words) if trains_then_scores(words) else []
            if lit_transformer_command(line) and page == pages[-1]:
                for path in flag_values(words, READS):
                    known = (
                        path in ("last", "")
                        or (ROOT / path).exists()
                        or ("/" not in path and "." not in path)  # an embedded corpus, a hub name, a kind
                        or OWN.search(path)
                        or resolve_config(path) != path  # a config that ships in the package, by name
                        or any(path == m or path.startswith(m + "/") for m in made + own_run)
                    )
                    if not known:
                        missing.append(f"{rel(page)}: {path} in {line[:120]}")
            made += made_by(words)
    return missing


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_bash_block_parses_as_the_shell_reads_it(page: Path) -> None:
    for block in bash_blocks(page):
        result = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert result.returncode == 0, f"{rel(page)}: bash cannot parse\n{block}\n{result.stderr}"
        for line in logical_lines(block):
            try:
                words = shlex.split(line, comments=True)
            except ValueError as error:
                raise AssertionError(f"{rel(page)}: {line!r} does not split into words: {error}") from error
            assert words and not words[0].startswith("-"), (
                f"{rel(page)}: {line!r} starts with an option: end the line before it with a backslash, or give the "
                "whole command"
            )


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_path_a_command_reads_is_made_before_it_or_the_readers_own(page: Path) -> None:
    pages = [ROOT / "README.md"] + ([page] if page.name != "README.md" else [])
    assert not unmade_reads(pages)


def package_command(command: str) -> bool:
    """A command of the package that is not the CLI's own: a benchmark (`bench NAME`), `ablate`, `digit-strips`,
    `translation-recipe`; the other tests parse only the CLI's commands, so this file parses these on every page."""
    return (
        re.match(r"python -m lit_transformer (bench|ablate|digit-strips|translation-recipe)(\s|$)", command) is not None
    )


@pytest.mark.parametrize("page", [p for p in PAGES if p not in README_RUN], ids=rel)
def test_every_lit_transformer_command_parses_with_the_cli(page: Path) -> None:
    """Each command parses with its own parser (a benchmark's, ablate's, the CLI's); X.yaml, a page's placeholder for
    any config, is read as the tiny preset. Of the pages another test parses, only the package commands it skips."""
    for block in bash_blocks(page):
        for line in logical_lines(block):
            command = lit_transformer_command(line)
            if command and (rel(page) not in PARSED_ELSEWHERE or package_command(command)):
                command = command.replace("X.yaml", "configs/presets/tiny.yaml")
                result = parse_only(command, ROOT)
                assert result.returncode == 0, f"{rel(page)}: {command}\n{result.stderr[-2000:]}"


def test_the_pages_parsed_elsewhere_are_parsed_there() -> None:
    for page, test in PARSED_ELSEWHERE.items():
        assert Path(page).name in (ROOT / "tests" / test).read_text() or test == "test_readme.py", (page, test)
        if test == "test_readme.py":
            assert ROOT / page in README_RUN, f"tests/test_readme.py no longer runs {page}'s commands"


def test_a_dangling_option_line_and_an_unmade_path_are_caught(tmp_path: Path) -> None:
    """The slips this file is for: an option line continuing nothing, and a tokenizer no command makes."""
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\npython -m lit_transformer fit --config configs/base.yaml\n    --model.lora.rank 16\n```\n"
        "```bash\npython -m lit_transformer fit --config configs/base.yaml --data.init_args.tokenizer tok.json\n```\n"
    )
    lines = [line for block in bash_blocks(page) for line in logical_lines(block)]
    assert lines[1] == "--model.lora.rank 16"
    assert unmade_reads([page]) == [f"{page}: tok.json in {lines[2]}"]
    page.write_text("```bash\nprintf 'a' > tok.json\n" + page.read_text().split("```\n```bash\n")[1])
    assert unmade_reads([page]) == []
