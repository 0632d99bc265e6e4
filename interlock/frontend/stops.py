"""Stop strings matched on the text stream, across token boundaries.

A stop string may arrive split over several tokens (or several output chunks), so the matcher
holds back the last ``len(longest stop) - 1`` characters: they might be the start of a stop
string. When a stop string appears, the text before it is emitted, the stop string and
everything after it are dropped, and the request ends with finish_reason "stop" (OpenAI's
behaviour: the stop sequence is not part of the output; with vLLM's
``include_stop_str_in_output`` it is, and only what follows it is dropped).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str], *, include: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.stopped = False

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def push(self, text: str) -> str:
        """Add decoded text; return what is safe to emit. Sets ``stopped`` on a match."""
        if self.stopped or not text:
            return ""
        if not self._stops:
            return text
        buffer = self._pending + text
        match = self._first_match(buffer)
        if match is not None:
            self.stopped = True
            self._pending = ""
            cut, stop = match
            return buffer[: cut + len(stop)] if self._include else buffer[:cut]
        keep = min(self._hold, len(buffer))
        self._pending = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of the stream: the held-back tail (it did not start a stop string)."""
        tail, self._pending = self._pending, ""
        return "" if self.stopped else tail

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        """The earliest stop string in ``buffer`` (the longest of those starting there)."""
        hits = [(i, -len(s), s) for i, s in ((buffer.find(s), s) for s in self._stops) if i >= 0]
        if not hits:
            return None
        i, _, stop = min(hits)
        return i, stop
