"""A request's ids as text, piece by piece: incremental detokenisation and stop strings.

`TextStream.push(ids)` returns the text those ids add, never a partial multi-byte character (a
piece that decodes to U+FFFD waits for its next ids), and holds back any tail that could still
become a stop string; once a stop string appears, the text ends just before it. `finish()`
releases what was held back.

Only a window of the latest ids is decoded each time (from the last few ids already shown), so a
long output costs the same per token as a short one.
"""
from __future__ import annotations

from typing import Protocol

_CONTEXT = 6  # ids decoded again before the new ones, so that a token's leading space or merge is right


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class TextStream:
    def __init__(self, tokenizer: Decoder, stop: tuple[str, ...] = (), hidden_ids: tuple[int, ...] = ()):
        """`stop`: strings that end the text (excluded); `hidden_ids`: ids not shown as text (the
        end-of-sequence ids that end a request)."""
        self.tokenizer, self.stop, self.hidden = tokenizer, tuple(s for s in stop if s), frozenset(hidden_ids)
        self.ids: list[int] = []
        self._shown = 0  # ids whose text has been decoded
        self._pending = ""  # decoded text not yet released (a stop string may start in it)
        self.stopped = False  # a stop string was found: nothing more is released

    def push(self, ids) -> str:
        """The text these ids add that can be released now."""
        if self.stopped:
            return ""
        self.ids.extend(i for i in ids if i not in self.hidden)
        self._decode(final=False)
        return self._release(final=False)

    def finish(self) -> str:
        """What is still held back, at the request's end."""
        if self.stopped:
            return ""
        self._decode(final=True)
        return self._release(final=True)

    def _decode(self, final: bool) -> None:
        """Move the text of the ids not yet shown to the pending text, unless it ends in an incomplete
        character (or does not extend its context's text) and more ids may still come."""
        start = max(0, self._shown - _CONTEXT)
        before = self.tokenizer.decode(self.ids[start:self._shown])
        text = self.tokenizer.decode(self.ids[start:])
        if text.startswith(before) and (final or not text.endswith("\ufffd")):
            added = text[len(before):]
        elif final:
            added = self.tokenizer.decode(self.ids[self._shown:])
        else:
            return
        self._shown = len(self.ids)
        self._pending += added

    def _release(self, final: bool) -> str:
        # the stop string completed first (at equal ends the longest): the same cut however ids arrive
        found = [(i + len(s), i) for s in self.stop if (i := self._pending.find(s)) >= 0]
        cut = min(found)[1] if found else -1
        if cut >= 0:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        keep = 0 if final else self._held_back()
        out, self._pending = self._pending[:len(self._pending) - keep], self._pending[len(self._pending) - keep:]
        return out

    def _held_back(self) -> int:
        """Characters at the end of the pending text that begin some stop string."""
        text = self._pending
        return max((n for s in self.stop for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
