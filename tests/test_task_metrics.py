"""Every number a task logs at validation and test equals an independent reference on a fixed batch.

One case per task (CASES): a tiny model, two evaluation batches of different sizes (so a mean of batch means, or a
metric over the first batch only, reads differently from the split's value), what the DataModule would say, and a
reference written out here: the cross-entropy and perplexity formulas, bits per character, a hand count of correct
tokens, scikit-learn's accuracy and F1 on an imbalanced batch (so accuracy, micro, macro and per-class F1 differ),
and sacreBLEU over all the references of each caption. Generated text (BLEU, exact match) comes from a fixed table,
not the untrained model, so each metric has non-trivial values. The test compares every logged key, so a task that
logs a new number, or a new task, fails until its reference is written here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import pytest
import sacrebleu
import torch
from sklearn.metrics import accuracy_score, f1_score

from lit_transformer.config import TransformerConfig
from lit_transformer.engine.lightning_module import LitTransformer
from lit_transformer.tasks import (
    IGNORE_INDEX,
    TASKS,
    Captioning,
    Classification,
    LanguageModeling,
    MaskedLM,
    Task,
    Translation,
)
from lit_transformer.tasks.masked_lm import mask_tokens

STAGES = {"validate": "val", "test": "test"}


@dataclass
class Case:
    """What one task's check needs: its module, its batches, the DataModule's attributes, and the reference values
    (keyed without the stage prefix) of a stage ("val" or "test") given the module and the batches."""

    config: TransformerConfig
    task: Callable[[], Task]
    batches: Callable[[], list[dict[str, Any]]]
    reference: Callable[[LitTransformer, list[dict[str, Any]], str], dict[str, float]]
    data: dict[str, Any] = field(default_factory=dict)
    generated: dict[int, str] | None = None  # row id -> the text generate_text returns for it


class _Data(L.LightningDataModule):
    """Evaluation batches as given, with the attributes a task reads from its DataModule."""

    def __init__(self, batches: list[dict[str, Any]], **attributes: Any) -> None:
        super().__init__()
        self.batches = batches
        for name, value in attributes.items():
            setattr(self, name, value)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.batches, batch_size=None)

    test_dataloader = val_dataloader


def _tokens(seed: int, rows: int, length: int, low: int = 4) -> torch.Tensor:
    return torch.randint(low, 128, (rows, length), generator=torch.Generator().manual_seed(seed))


def _right_padded(rows: int, length: int, real: list[int]) -> torch.Tensor:
    return torch.arange(length)[None, :] < torch.tensor(real)[:, None]


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log p = z - log sum exp z, in float64."""
    z = logits.double()
    return z - z.exp().sum(dim=-1, keepdim=True).log()


def _token_reference(logits: list[torch.Tensor], labels: list[torch.Tensor], smoothing: float) -> dict[str, float]:
    """Per-target means over the whole split: smoothed loss, NLL, perplexity and a hand count of argmax hits."""
    nll = smoothed = hits = count = 0.0
    for z, y in zip(logits, labels, strict=True):
        log_p = _log_softmax(z.reshape(-1, z.size(-1)))
        for row, target in zip(log_p, y.reshape(-1).tolist(), strict=True):
            if target == IGNORE_INDEX:
                continue
            count += 1
            nll += -float(row[target])
            smoothed += (1 - smoothing) * -float(row[target]) + smoothing * -float(row.mean())
            hits += int(row.argmax()) == target
    return {"loss": smoothed / count, "nll": nll / count, "ppl": math.exp(nll / count), "accuracy": hits / count}


@torch.no_grad()
def _eval_logits(module: LitTransformer, *args: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    module.model.eval()
    return module.model(*args, **kwargs)


# ---- language modelling: loss with smoothing, NLL, perplexity, bits per character, token accuracy ---------------

CHARACTERS_PER_TOKEN = {"validation": 3.0, "test": 4.5}


def _lm_batches() -> list[dict[str, Any]]:
    out = []
    for seed, real in ((0, [7, 7, 4]), (1, [3, 7])):  # 18 and 10 targets
        ids = _tokens(seed, len(real), 8)
        mask = _right_padded(len(real), 7, real)
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:].masked_fill(~mask, IGNORE_INDEX)})
    return out


def _lm_reference(module, batches, stage):
    logits = [_eval_logits(module, b["input_ids"]) for b in batches]
    out = _token_reference(logits, [b["labels"] for b in batches], smoothing=0.1)
    split = "validation" if stage == "val" else "test"
    return out | {"bpc": out["nll"] / math.log(2) / CHARACTERS_PER_TOKEN[split]}


# ---- translation: the token metrics, and BLEU (sacreBLEU, 13a) on the validation budget or every test pair -------

SENTENCES = {
    0: ("the cat sat on the mat near the door", "the cat sat on the mat by the door"),
    1: ("a dog runs in the green park every morning", "a dog runs in the park every morning"),
    2: ("we read the old book by the warm fire", "we read an old book by the fire"),
    3: ("she sells sea shells on the sea shore", "she sells shells on the sea shore today"),
    4: ("the rain falls on the plain in spain", "rain falls mainly on the plain in spain"),
}  # row id -> (what the model says, the reference)


def _pair_batches(references: Callable[[int], Any], key: str) -> list[dict[str, Any]]:
    """Two batches (3 rows, then 2) whose source's first token is the row id; targets right-padded."""
    out = []
    for seed, rows, real in ((2, [0, 1, 2], [7, 5, 6]), (3, [3, 4], [4, 7])):
        ids = _tokens(seed, len(rows), 8)
        mask = _right_padded(len(rows), 7, real)
        src = ids[:, 1:].clone()
        src[:, 0] = torch.tensor(rows)
        batch = {"src": src, "src_mask": torch.ones_like(src, dtype=torch.bool), "tgt_in": ids[:, :-1]}
        batch |= {"tgt_mask": mask, "labels": ids[:, 1:].masked_fill(~mask, IGNORE_INDEX)}
        batch[key] = [references(r) for r in rows]
        out.append(batch)
    return out


def _row_ids(src: torch.Tensor) -> list[int]:
    return [int(round(float(x))) for x in (src[:, 0] if src.dim() == 2 else src[:, 0, 0])]


def _scored_rows(batches, stage: str, budget: int) -> list[int]:
    """The rows BLEU reads: at validation the first `budget` of the split (bleu_samples), at test all of them."""
    rows = [r for b in batches for r in _row_ids(b["src"])]
    return rows[:budget] if stage == "val" else rows


def _translation_reference(module, batches, stage):
    logits = [_eval_logits(module, b["src"], b["tgt_in"], src_mask=b["src_mask"]) for b in batches]
    out = _token_reference(logits, [b["labels"] for b in batches], smoothing=0.1)
    rows = _scored_rows(batches, stage, budget=4)
    bleu = sacrebleu.corpus_bleu([SENTENCES[r][0] for r in rows], [[SENTENCES[r][1] for r in rows]], tokenize="13a")
    return out | {"bleu": bleu.score}


# ---- captioning: the token metrics, BLEU and exact match against every reference caption --------------------------

CAPTIONS = {
    0: (
        "a man rides a red bike down the hill",
        ["a man on a bike", "a man rides a red bike down the hill", "a cyclist"],
    ),
    1: (
        "two dogs play with a ball on the grass",
        ["dogs on grass", "two dogs", "two dogs play with a ball in the park"],
    ),
    2: ("a plate of food on a wooden table", ["a plate of food on a wooden table", "food", "a meal on a table"]),
    3: ("a bird sits on a branch of a tree", ["a small bird", "a bird on a tree", "a bird sits on a high branch"]),
    4: ("a boat on the calm blue lake", ["a boat", "a boat on a lake", "a boat on the calm blue lake"]),
}  # row id -> (the model's caption, three references; the exact matches are not the first reference)


def _caption_batches() -> list[dict[str, Any]]:
    out = []
    for batch in _pair_batches(lambda r: CAPTIONS[r][1], "references"):
        rows = _row_ids(batch["src"])
        features = torch.randn(len(rows), 7, 5, generator=torch.Generator().manual_seed(rows[0]))
        features[:, 0, 0] = torch.tensor(rows, dtype=torch.float32)  # the row id, read by the generation table
        batch["src"] = features
        batch["image"] = [f"image{r}.png" for r in rows]
        out.append(batch)
    return out


def _caption_reference(module, batches, stage):
    logits = [_eval_logits(module, b["src"], b["tgt_in"], src_mask=b["src_mask"]) for b in batches]
    out = _token_reference(logits, [b["labels"] for b in batches], smoothing=0.0)
    rows = _scored_rows(batches, stage, budget=4)
    hypotheses = [CAPTIONS[r][0] for r in rows]
    references = [CAPTIONS[r][1] for r in rows]
    bleu = sacrebleu.corpus_bleu(hypotheses, [list(refs) for refs in zip(*references, strict=True)], tokenize="13a")
    exact = sum(h in refs for h, refs in zip(hypotheses, references, strict=True)) / len(rows)
    return out | {"bleu": bleu.score, "exact_match": exact}


# ---- classification: weighted loss, plain NLL, accuracy, macro F1 and F1 per class by name (scikit-learn) ----------

LABEL_NAMES = ["ant", "bee", "cat"]
CLASS_WEIGHTS = [1.0, 2.0, 0.5]
# row id -> (true class, predicted class): 6 ants, 3 bees, 2 cats; accuracy (= micro F1) 0.636, macro F1 0.600,
# weighted F1 0.643, per class 0.727, 0.571, 0.500
CLASSIFIED = [(0, 0), (0, 0), (0, 0), (0, 0), (0, 1), (0, 2), (1, 1), (1, 1), (1, 0), (2, 2), (2, 1)]


def _classifier_logits(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A stand-in for the model: the predicted class of each row id scores highest, with a confidence by row."""
    rows = input_ids[:, 0].tolist()
    logits = torch.zeros(len(rows), 3)
    for i, r in enumerate(rows):
        logits[i, CLASSIFIED[r][1]] = 1.0 + 0.3 * r
        logits[i, (CLASSIFIED[r][1] + 1) % 3] = 0.2 * (r % 3)
    return logits


def _classification_batches() -> list[dict[str, Any]]:
    out = []
    for seed, rows in ((4, range(0, 7)), (5, range(7, 11))):
        ids = _tokens(seed, len(rows), 6)
        ids[:, 0] = torch.tensor(list(rows))
        labels = torch.tensor([CLASSIFIED[r][0] for r in rows])
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool), "labels": labels})
    return out


def _classification_reference(module, batches, stage):
    logits = torch.cat([_classifier_logits(b["input_ids"]) for b in batches])
    y = torch.cat([b["labels"] for b in batches]).tolist()
    predicted = logits.argmax(dim=-1).tolist()
    nll = [-float(row[t]) for row, t in zip(_log_softmax(logits), y, strict=True)]
    weights = [CLASS_WEIGHTS[t] for t in y]
    out = {
        "loss": sum(w * n for w, n in zip(weights, nll, strict=True)) / sum(weights),  # torch's weighted mean
        "nll": sum(nll) / len(nll),
        "accuracy": accuracy_score(y, predicted),
        "f1": f1_score(y, predicted, average="macro"),
    }
    per_class = f1_score(y, predicted, average=None, labels=[0, 1, 2])
    return out | {f"f1/{name}": float(v) for name, v in zip(LABEL_NAMES, per_class, strict=True)}


# ---- masked LM: the loss and accuracy at the chosen positions only (a hand count) ---------------------------------


def _mlm_batches() -> list[dict[str, Any]]:
    out = []
    for seed, real in ((6, [12, 9, 5]), (7, [12, 3])):
        mask = _right_padded(len(real), 12, real)
        out.append({"input_ids": _tokens(seed, len(real), 12).masked_fill(~mask, 0), "attention_mask": mask})
    return out


def _mlm_reference(module, batches, stage):
    cfg = module.config
    specials = [i for i in (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id, cfg.mask_token_id) if i is not None]
    logits, labels = [], []
    for index, b in enumerate(batches):  # each evaluation batch masks as a generator seeded by its index draws
        inputs, targets = mask_tokens(b["input_ids"], cfg.mask_token_id, cfg.vocab_size, probability=0.3,
                                      attention_mask=b["attention_mask"], special_ids=specials,
                                      generator=torch.Generator().manual_seed(index))  # fmt: skip
        assert (targets[~b["attention_mask"]] == IGNORE_INDEX).all()
        logits.append(_eval_logits(module, inputs, attention_mask=b["attention_mask"]))
        labels.append(targets)
    return _token_reference(logits, labels, smoothing=0.05)


CASES: dict[str, Case] = {
    "language_modeling": Case(
        TransformerConfig.preset("tiny"),
        lambda: LanguageModeling(label_smoothing=0.1),
        _lm_batches,
        _lm_reference,
        data={"characters_per_token": CHARACTERS_PER_TOKEN.__getitem__},
    ),
    "translation": Case(
        TransformerConfig.preset("tiny", topology="encoder_decoder"),
        lambda: Translation(label_smoothing=0.1),
        lambda: _pair_batches(lambda r: SENTENCES[r][1], "ref_text"),
        _translation_reference,
        data={"bleu_samples": 4},
        generated={r: hypothesis for r, (hypothesis, _) in SENTENCES.items()},
    ),
    "classification": Case(
        TransformerConfig.preset("tiny", topology="encoder_only", num_labels=3),
        lambda: Classification(class_weights=CLASS_WEIGHTS),
        _classification_batches,
        _classification_reference,
        data={"label_names": LABEL_NAMES},
    ),
    "masked_lm": Case(
        TransformerConfig.preset("tiny", topology="encoder_only", head="masked_lm", mask_token_id=3),
        lambda: MaskedLM(label_smoothing=0.05, mlm_probability=0.3),
        _mlm_batches,
        _mlm_reference,
    ),
    "captioning": Case(
        TransformerConfig.preset("tiny", topology="encoder_decoder", source="features", source_dim=5),
        Captioning,
        _caption_batches,
        _caption_reference,
        data={"bleu_samples": 4},
        generated={r: caption for r, (caption, _) in CAPTIONS.items()},
    ),
}


def test_every_task_has_a_metric_case() -> None:
    """A new task inherits the check below: it fails here until its case (batches and reference) is written."""
    assert sorted(CASES) == sorted(TASKS)


def _module(case: Case, monkeypatch: pytest.MonkeyPatch) -> LitTransformer:
    torch.manual_seed(0)
    module = LitTransformer(case.config, task=case.task())
    if case.generated is not None:
        table = case.generated
        monkeypatch.setattr(module, "generate_text", lambda src, mask=None: [table[r] for r in _row_ids(src)])
    if isinstance(module.task, Classification):
        monkeypatch.setattr(module.model, "forward", _classifier_logits)
    return module


@pytest.mark.parametrize("command", STAGES)
@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_logged_metric_equals_its_reference(name: str, command: str, monkeypatch) -> None:
    case, stage = CASES[name], STAGES[command]
    module, batches = _module(case, monkeypatch), case.batches()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (logged,) = getattr(trainer, command)(module, datamodule=_Data(batches, **case.data))
    expected = {f"{stage}/{key}": value for key, value in case.reference(module, batches, stage).items()}
    assert sorted(logged) == sorted(expected)
    assert logged == {key: pytest.approx(value, rel=1e-5, abs=1e-6) for key, value in expected.items()}


def test_the_classification_batch_tells_the_averages_apart() -> None:
    """The batch is imbalanced enough that accuracy (= micro F1), macro, weighted and per-class F1 all differ, and
    the validation BLEU budget, the first reference and all references give different scores."""
    y, predicted = zip(*CLASSIFIED, strict=True)
    values = [accuracy_score(y, predicted)] + [f1_score(y, predicted, average=a) for a in ("macro", "weighted")]
    values += list(f1_score(y, predicted, average=None))
    assert len({round(v, 6) for v in values}) == len(values)
    hypotheses, references = zip(*CAPTIONS.values(), strict=True)
    first_only = sacrebleu.corpus_bleu(list(hypotheses), [[refs[0] for refs in references]]).score
    every = sacrebleu.corpus_bleu(list(hypotheses), [list(r) for r in zip(*references, strict=True)]).score
    assert every > first_only + 10
    assert sum(h in refs for h, refs in zip(hypotheses, references, strict=True)) == 3
    assert sum(h == refs[0] for h, refs in zip(hypotheses, references, strict=True)) == 1


@pytest.mark.parametrize("name", sorted(TASKS))
def test_no_task_is_told_to_sync_numbers_its_metrics_already_reduced(name: str, monkeypatch, tmp_path) -> None:
    """In a distributed run Lightning advises `sync_dist=True` for every epoch-level tensor logged; perplexity, bits
    per character, BLEU and per-class F1 come from torchmetrics' compute(), which has reduced them over the ranks
    already, so the advice (which reads as though the figure were rank 0's alone) is not shown for them. A process
    group of one makes Lightning take the distributed path here."""
    import warnings

    import torch.distributed as dist
    from lightning.pytorch.trainer.connectors.logger_connector.result import warning_cache

    case = CASES[name]
    module, batches = _module(case, monkeypatch), case.batches()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    warning_cache.clear()  # Lightning says each advice once per process
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.validate(module, datamodule=_Data(batches, **case.data))
    finally:
        dist.destroy_process_group()
    assert not [str(w.message) for w in caught if "sync_dist=True" in str(w.message)]


# ---- corpus BLEU: sacreBLEU's score whatever the corpus ------------------------------------------------------------
NO_FOUR_GRAM = (["the cat sat on a mat today", "a dog ran"], [["the cat is on the mat"], ["the dog ran off"]])
# Two references as far (in length) from each caption: sacreBLEU's brevity penalty takes the shorter.
TIED = (
    ["seven two nine one", "three three five eight"],
    [["seven two nine one x y", "seven two"], ["three three five eight a b", "three three"]],
)


def _bleu(hypotheses, references) -> tuple[float, str]:
    from lit_transformer.tasks.corpus_bleu import CorpusBLEU

    metric = CorpusBLEU()
    metric.update(hypotheses, references)
    return float(metric.compute()) * 100, metric.signature


def test_bleu_is_sacrebleus_with_an_n_gram_order_unmatched() -> None:
    """No 4-gram matches: sacreBLEU's exp smoothing (the signature's smooth:exp) gives a positive score, which the
    task reports (torchmetrics' SacreBLEUScore, unsmoothed, gave 0.0 under that signature)."""
    hypotheses, references = NO_FOUR_GRAM
    expected = sacrebleu.corpus_bleu(hypotheses, [[refs[0] for refs in references]], tokenize="13a")
    score, signature = _bleu(hypotheses, references)
    assert expected.counts[3] == 0 and expected.score > 1
    assert score == pytest.approx(expected.score, rel=1e-6)
    assert signature == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"


@pytest.mark.parametrize("order", [1, -1], ids=["longer-first", "shorter-first"])
def test_bleu_of_several_references_does_not_depend_on_their_order(order: int) -> None:
    """Two references as near in length to the caption: sacreBLEU's brevity penalty reads the shorter one, whichever
    is listed first (torchmetrics read the first: 60.65 or 100.0 by the order of a captions file's rows)."""
    hypotheses, references = TIED
    references = [refs[::order] for refs in references]
    streams = [list(r) for r in zip(*references, strict=True)]
    assert _bleu(hypotheses, references)[0] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, streams).score)
    assert _bleu(hypotheses, references)[0] == pytest.approx(100.0)


def test_bleu_sums_its_statistics_over_parts_as_over_ranks() -> None:
    """The statistics of two halves (two ranks, or two batches), merged as a distributed run reduces them, give the
    whole corpus's score; pairs with different numbers of references make the signature say nrefs:var."""
    from lit_transformer.tasks.corpus_bleu import CorpusBLEU

    hypotheses = NO_FOUR_GRAM[0] + TIED[0]
    references = NO_FOUR_GRAM[1] + TIED[1]
    first, second = CorpusBLEU(), CorpusBLEU()
    first.update(hypotheses[:2], references[:2])
    second.update(hypotheses[2:], references[2:])
    first.merge_state(second)
    whole, signature = _bleu(hypotheses, references)
    assert float(first.compute()) * 100 == pytest.approx(whole, rel=1e-6)
    assert "nrefs:var" in signature and first.signature == signature
    padded = [[refs[0] for refs in references], [refs[-1] for refs in references]]  # a 1-reference pair twice
    assert whole == pytest.approx(sacrebleu.corpus_bleu(hypotheses, padded).score, rel=1e-6)


# ---- bits per character of part of a split -------------------------------------------------------------------------
WORDS = [f"w{'x' * (i % 5)}{i}" for i in range(128)]  # tokens that decode to 2 to 7 characters


@pytest.mark.parametrize("command", STAGES)
def test_bpc_of_a_split_cut_short_reads_the_characters_scored(command: str, monkeypatch) -> None:
    """limit_val_batches (limit_test_batches) scores the first batches only: bits per character divides their bits
    by their own characters (the words the targets decode to, and the spaces between), not by the whole split's
    characters per token (11% off over the tiny preset's 2 validation batches); the whole split keeps its ratio."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    case, stage = CASES["language_modeling"], STAGES[command]
    module, batches = _module(case, monkeypatch), case.batches()
    module.tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w0"))
    limit = {f"limit_{'val' if stage == 'val' else 'test'}_batches": 1}
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, **limit)
    (logged,) = getattr(trainer, command)(module, datamodule=_Data(batches, **case.data))

    first = batches[0]
    nll = _token_reference([_eval_logits(module, first["input_ids"])], [first["labels"]], smoothing=0.1)["nll"]
    rows = [[WORDS[t] for t in row if t != IGNORE_INDEX] for row in first["labels"].tolist()]
    characters = sum(len(" ".join(words)) for words in rows)
    targets = sum(map(len, rows))
    assert logged[f"{stage}/nll"] == pytest.approx(nll, rel=1e-5)
    assert logged[f"{stage}/bpc"] == pytest.approx(nll / math.log(2) / (characters / targets), rel=1e-5)

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (logged,) = getattr(trainer, command)(module, datamodule=_Data(batches, **case.data))  # the whole split
    assert logged[f"{stage}/bpc"] == pytest.approx(case.reference(module, batches, stage)["bpc"], rel=1e-5)
