"""Turns a request's stream of ``GenerateOutput`` chunks into text deltas and counts.

One per request. Per chunk: count the tokens, detokenize incrementally, cut at a stop string,
and decide the finish reason. Pure and synchronous; the HTTP layer only writes what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from interlock.errors import EngineError, InterlockError, rebuild
from interlock.frontend.detokenizer import IncrementalDetokenizer
from interlock.frontend.stops import StopMatcher
from interlock.frontend.tokenizer import ModelTokenizer
from interlock.protocol import ErrorInfo, GenerateOutput, TokenLogprobs


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    logprobs: tuple[TokenLogprobs, ...] | None
    finish_reason: str | None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    """In the first delta, when the request asked for them (``GenerateOutput.prompt_logprobs``)."""


class OutputAssembler:
    def __init__(
        self,
        tokenizer: ModelTokenizer,
        prompt_ids: Sequence[int],
        *,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        include_stop: bool = False,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
        self._stops = StopMatcher(stop, include=include_stop)
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def push(self, out: GenerateOutput) -> Delta:
        """The delta for one output chunk. Raises the chunk's error if it carries one."""
        if out.error is not None or out.finish_reason == "error":
            raise error_from_info(out.error)
        self.completion_tokens += len(out.token_ids)
        self.cached_tokens = max(self.cached_tokens, out.num_cached_tokens)
        text = self._detok.push(out.token_ids)
        if out.finished:
            text += self._detok.flush()
        text = self._stops.push(text)
        if self._stops.stopped:
            self.finish_reason = "stop"
        elif out.finished:
            text += self._stops.flush()
            self.finish_reason = out.finish_reason
        return Delta(text, out.logprobs, self.finish_reason, out.prompt_logprobs)


def error_from_info(info: ErrorInfo | None) -> InterlockError:
    """Rebuild the error a worker reported in an output chunk (EngineError if unknown)."""
    if info is None:
        return EngineError("the engine reported an error")
    return rebuild(info.code, info.message, info.param, unknown=EngineError)
