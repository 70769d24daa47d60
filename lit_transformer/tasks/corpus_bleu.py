"""sacreBLEU's corpus BLEU as a torchmetrics Metric: the score `sacrebleu.corpus_bleu` gives, reduced over ranks.

torchmetrics' SacreBLEUScore tokenizes as sacreBLEU does but scores otherwise: no smoothing (an n-gram order without
a match gives 0.0 where sacreBLEU's default, exp smoothing, gives a positive score, so an early curve sits at 0 and
the signature we log would be wrong), and the brevity penalty's closest reference breaks ties toward the first listed
one (sacreBLEU: the shorter), so a multi-reference score depended on the order of the references. Here sacreBLEU
itself counts each sentence's statistics; the metric sums them (over batches and ranks) and sacreBLEU turns the sums
into the score, so the number is sacreBLEU's, whatever the corpus, and the signature says how it was computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

MAX_ORDER = 4
"""BLEU's n-gram orders (sacreBLEU's default)."""


class CorpusBLEU(Metric):
    """Corpus BLEU in [0, 1] (sacreBLEU's score / 100) over every (hypothesis, references) pair given to update;
    each pair may have its own number of references. `signature` is sacreBLEU's, after compute()."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, tokenize: str = "13a") -> None:
        import sacrebleu

        super().__init__()
        self.scorer = sacrebleu.BLEU(tokenize=tokenize, max_ngram_order=MAX_ORDER)
        for name, size in (("correct", MAX_ORDER), ("total", MAX_ORDER), ("lengths", 2)):  # lengths: system, ref
            self.add_state(name, torch.zeros(size, dtype=torch.long), dist_reduce_fx="sum")
        # The fewest and most references a pair had: the signature's nrefs (a number, or "var").
        self.add_state("fewest_refs", torch.tensor(torch.iinfo(torch.long).max), dist_reduce_fx="min")
        self.add_state("most_refs", torch.tensor(0), dist_reduce_fx="max")
        self.signature: str | None = None

    def update(self, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> None:
        for hypothesis, refs in zip(hypotheses, references, strict=True):
            # sacreBLEU's statistics of one sentence: its corpus score of a one-sentence corpus (public API).
            one = self.scorer.corpus_score([hypothesis], [[ref] for ref in refs])
            self.correct += torch.tensor(one.counts, device=self.correct.device)
            self.total += torch.tensor(one.totals, device=self.total.device)
            self.lengths += torch.tensor([one.sys_len, one.ref_len], device=self.lengths.device)
            self.fewest_refs = torch.minimum(self.fewest_refs, torch.tensor(len(refs), device=self.fewest_refs.device))
            self.most_refs = torch.maximum(self.most_refs, torch.tensor(len(refs), device=self.most_refs.device))

    def compute(self) -> torch.Tensor:
        scorer = self.scorer
        score = scorer.compute_bleu(
            self.correct.tolist(), self.total.tolist(), int(self.lengths[0]), int(self.lengths[1]),
            smooth_method=scorer.smooth_method, smooth_value=scorer.smooth_value,
            effective_order=scorer.effective_order, max_ngram_order=scorer.max_ngram_order,
        )  # fmt: skip
        fewest, most = int(self.fewest_refs), int(self.most_refs)
        scorer.num_refs = most if fewest == most else -1  # what sacreBLEU's signature reads: -1 is "var"
        self.signature = str(scorer.get_signature())
        return torch.tensor(score.score / 100.0, device=self.correct.device)
