"""Generated tokens followed as text while they are decoded: stop strings, stop ids and echoing to a terminal.

Used by the `generate` command (echo) and by the tasks' predictions; a `streamer` of Transformer.generate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

import torch
from tokenizers import Tokenizer


class TextStream:
    """Follows each row's new tokens as text while they are generated (a `streamer` for Transformer.generate).

    A row ends at a stop id or when its text contains a stop string (cut from `texts()`); `echo` receives row 0's
    text as it grows, holding back an incomplete UTF-8 character.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        rows: int,
        stop: Sequence[str] = (),
        stop_ids: Sequence[int | None] = (),
        echo: TextIO | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.stop_ids = {i for i in stop_ids if i is not None}
        self.echo = echo
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.done = [False] * rows
        self.echoed = 0

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        for row, token in enumerate(tokens.tolist()):
            if self.done[row]:
                continue
            if token in self.stop_ids:
                self.done[row] = True
                continue
            self.ids[row].append(token)
            if self.stop and self._cut(self._text(row)) is not None:
                self.done[row] = True
        if self.echo is not None:
            self._echo(final=False)
        return torch.tensor(self.done, device=tokens.device)

    def _text(self, row: int) -> str:
        return self.tokenizer.decode(self.ids[row], skip_special_tokens=True)

    def _cut(self, text: str) -> int | None:
        hits = [text.find(s) for s in self.stop if s in text]
        return min(hits) if hits else None

    def texts(self) -> list[str]:
        """Each row's text, cut before its first stop string."""
        out = []
        for row in range(len(self.ids)):
            text = self._text(row)
            cut = self._cut(text)
            out.append(text if cut is None else text[:cut])
        return out

    def _echo(self, final: bool) -> None:
        text = self.texts()[0] if final or self.done[0] else self._text(0)
        if not final:
            text = text.rstrip("\ufffd")  # a multi-byte character still arriving
            if self.stop:  # hold back what could be the start of a stop string
                longest = max(map(len, self.stop)) - 1
                text = text[: max(self.echoed, len(text) - longest)]
        if len(text) > self.echoed:
            self.echo.write(text[self.echoed :])
            self.echo.flush()
            self.echoed = len(text)

    def finish(self) -> None:
        """Echo whatever was held back."""
        if self.echo is not None:
            self._echo(final=True)
