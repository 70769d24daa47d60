"""Every Python name a page puts in backticks resolves: `module.name`, `Class.method`, `lit_transformer.x.Y`.

A page that names `GenerationConfig.for_model` when the code has `for_task`, or a module that moved, sends a reader to
nothing. This reads the inline code of the README and of docs/*.md (not the code blocks: test_doc_commands.py and
test_readme.py run those) and, for each dotted name, decides by rule what it is:
- a file (`config.json`, `heads.yaml`), or a config key (`model.config.n_layers`: its first part is a group of the
  command line), is not a Python name;
- a name whose first part is an importable module (`torch.compile`, `lit_transformer.errors.UserError`), a name the
  package defines (`Task.loss`, `GenerationConfig.for_task`), or a module of the package by its own name
  (`generation.vector_friendly_weights`) must resolve, by import and attribute access;
- anything else (a parameter's name inside a model, `qkv.lora_A.default`; a dotted column, `translation.en`) is not
  the package's and is left alone.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lit_transformer"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?$")
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# The last part of a file's name, not an attribute: what the pages name as files.
FILE_SUFFIXES = {"bin", "ckpt", "csv", "done", "gz", "jsonl", "json", "log", "md", "npy", "onnx", "parquet", "pkl",
                 "png", "pt", "py", "safetensors", "sbatch", "sh", "spm", "toml", "tsv", "txt", "yaml", "yml", "zst"}  # fmt: skip
# Common import aliases of the libraries the pages quote (`nn.Linear`, `F.linear`).
ALIASES = {"nn": "torch.nn", "F": "torch.nn.functional", "np": "numpy", "L": "lightning"}


@cache
def config_roots() -> frozenset[str]:
    """The command line's groups, the first part of a config key: the top-level keys of the packaged configs and the
    callback groups the CLI adds (`add_lightning_class_args(..., "checkpoint")`)."""
    roots = set()
    for path in (PACKAGE / "configs").rglob("*.yaml"):
        tree = yaml.safe_load(path.read_text())
        roots |= set(tree) if isinstance(tree, dict) else set()
    source = (PACKAGE / "cli" / "lightning_cli.py").read_text()
    roots |= set(re.findall(r'add_lightning_class_args\(\w+, "(\w+)"\)', source))
    return frozenset(roots | {"model", "data", "trainer"})


@cache
def package_index() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(a module's own name -> its dotted names, a top-level public name -> the modules that define it), read from
    the source (nothing imported)."""
    modules: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules.setdefault(dotted.rpartition(".")[2], []).append(dotted)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and not node.name.startswith("_"):
                names.setdefault(node.name, []).append(dotted)
    return modules, names


def python_names(text: str) -> list[str]:
    """The dotted names in a page's inline code (code blocks left out), files and config keys left out."""
    found = []
    for match in SPAN.finditer(FENCE.sub("", text)):
        name = match.group(1).strip()
        if not DOTTED.match(name):
            continue
        parts = name.removesuffix("()").split(".")
        if parts[-1] in FILE_SUFFIXES or parts[0] in config_roots():
            continue
        found.append(name.removesuffix("()"))
    return found


def attribute(obj: object, parts: list[str]) -> object:
    for part in parts:
        obj = getattr(obj, part)
    return obj


def resolve(name: str) -> bool | None:
    """True if the name resolves, False if it is the package's (or an installed library's) and does not, None if it is
    not a Python name this test can judge."""
    parts = name.split(".")
    if parts[0] in ALIASES:
        parts = [*ALIASES[parts[0]].split("."), *parts[1:]]
    modules, names = package_index()
    if parts[0] == "lit_transformer" or importlib.util.find_spec(parts[0]) is not None:
        candidates = [parts]
    elif parts[0] in names:  # a class or function of the package: Task.loss, GenerationConfig.for_task
        candidates = [[*module.split("."), *parts] for module in names[parts[0]]]
    elif len(modules.get(parts[0], [])) == 1:  # a module by its own name: generation.vector_friendly_weights
        candidates = [[*modules[parts[0]][0].split("."), *parts[1:]]]
    else:
        return None
    for candidate in candidates:
        for cut in range(len(candidate), 0, -1):  # the longest importable module, then attributes
            try:
                module = importlib.import_module(".".join(candidate[:cut]))
            except ImportError:
                continue
            try:
                attribute(module, candidate[cut:])
                return True
            except AttributeError:
                break
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_name_a_page_quotes_resolves(page: Path):
    missing = [name for name in python_names(page.read_text()) if resolve(name) is False]
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def test_the_rule_tells_names_from_files_and_keys():
    """The checker itself: a renamed method is caught; files, config keys and names inside a model are not judged."""
    text = (
        "`GenerationConfig.for_model` `GenerationConfig.for_task` `model.config.n_layers` `heads.yaml` "
        "`lit_transformer.errors.UserError` `lit_transformer.errors.NoSuchError` `qkv.lora_A.default` `torch.compile`"
    )
    names = python_names(text)
    assert "model.config.n_layers" not in names and "heads.yaml" not in names
    verdicts = {name: resolve(name) for name in names}
    assert verdicts == {
        "GenerationConfig.for_model": False,
        "GenerationConfig.for_task": True,
        "lit_transformer.errors.UserError": True,
        "lit_transformer.errors.NoSuchError": False,
        "qkv.lora_A.default": None,
        "torch.compile": True,
    }
