"""Structured outputs in the step: each constrained row's allowed tokens, applied to its logits.

The runner owns one ``Constraints``. Per step it calls ``forget(batch.finished_request_ids)``,
``mask(logits, requests)`` before sampling and ``accept(requests, tokens)`` after. Only rows
whose ``sampling.structured`` is set are touched: a step with none costs one attribute test per
sampled row, and the grammar engine is not even loaded until the first constrained request.

Masking: each constrained row's matcher writes a bitmask (one bit per token id); the bitmasks
become a 0 / -inf bias (a 256-entry table per byte) added to those rows in place, so allowed
logits keep their exact values. Ids the tokenizer lacks (a model that pads its vocabulary) are
never allowed. When the grammar is complete only EOS is allowed. A row whose constraint cannot
be enforced (its matcher refused a token, or a spec no frontend checked does not compile) is
allowed EOS only: the request ends early rather than produce unconstrained text, and the reason
is logged.

Matchers are keyed by request id, and the request's own output is the truth they are checked
against: a matcher is used as is while it has accepted exactly the request's outputs (its count
and last token), and is otherwise rebuilt by accepting ``output_token_ids``. That one rule covers
every way a request reaches a step with outputs this runner did not sample: preempted and
recomputed, migrated here with ``resume_token_ids``, a first token sampled by a prefill worker.
Matchers of requests listed in ``finished_request_ids`` (finished, aborted, preempted) are
dropped, and at most ``max_matchers`` are kept (least recently used first out), so nothing
grows without bound; a preempted request that comes back is rebuilt (~4 µs per output token).
"""

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from interlock.engine.grammar import GrammarCompiler, Matcher
from interlock.engine.runner import ScheduledRequest
from interlock.errors import InterlockError

log = logging.getLogger(__name__)

_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(bool)
_BIAS = np.where(_BITS, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
"""Byte value -> the bias of its 8 tokens (bit k of byte b is token 8b + k)."""


def bitmask_bias(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """``[rows, words]`` int32 bitmasks -> ``[rows, vocab]`` float32: 0 allowed, -inf not (ids
    past the bitmask's end are not allowed)."""
    rows, words = bitmask.shape
    bias = np.take(_BIAS, np.ascontiguousarray(bitmask).view(np.uint8), axis=0).reshape(rows, words * 32)
    if vocab <= words * 32:
        return bias[:, :vocab]
    return np.concatenate([bias, np.full((rows, vocab - words * 32), -np.inf, np.float32)], axis=1)


def apply_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: Sequence[int] | None = None) -> None:
    """In place: keep the allowed logits of ``rows`` (all rows when None; ``bitmask[k]`` is
    ``rows[k]``'s), set the others to -inf. Adding 0 keeps a logit bit-identical (a +inf
    logit of a disallowed token becomes NaN: the sampler's fallback for a bad row)."""
    bias = torch.from_numpy(bitmask_bias(bitmask, logits.shape[-1])).to(logits.device)
    if rows is None or (len(rows) == logits.shape[0] and list(rows) == list(range(len(rows)))):
        logits.add_(bias)
    else:
        index = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
        logits.index_add_(0, index, bias)


@dataclass(slots=True)
class _State:
    key: tuple[str, str]
    matcher: Matcher | None
    """None: the constraint cannot be enforced (the row is allowed EOS only)."""


class Constraints:
    def __init__(
        self,
        folder: Path | None,
        *,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        max_matchers: int = 4096,
    ) -> None:
        """``folder``: the model's (its ``tokenizer.json``); None: constrained rows get EOS only.
        ``vocab_size``: the logits' width."""
        self.folder = folder
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(t for t in eos_token_ids if 0 <= t < vocab_size)
        self.max_matchers = max_matchers
        self._compiler: GrammarCompiler | None = None
        self._states: OrderedDict[str, _State] = OrderedDict()

    @property
    def compiler(self) -> GrammarCompiler:
        """The grammar compiler for the model's vocabulary, built on first use (~0.3 s)."""
        if self._compiler is None:
            if self.folder is None:
                raise FileNotFoundError("no model folder: structured outputs are unavailable")
            self._compiler = GrammarCompiler.from_folder(
                self.folder, eos_token_ids=self.eos_token_ids, vocab_size=self.vocab_size
            )
        return self._compiler

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop the matchers of requests that ended (``SchedulerOutput.finished_request_ids``)."""
        if self._states:
            for rid in request_ids:
                self._states.pop(rid, None)

    def mask(self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> None:
        """In place, on the rows (``logits[i]`` is ``requests[i]``'s) that are constrained."""
        rows = [i for i, r in enumerate(requests) if r.sampling.structured is not None]
        if not rows:
            return
        words = (self.vocab_size + 31) // 32
        bitmask = np.zeros((len(rows), words), dtype=np.int32)
        for k, i in enumerate(rows):
            matcher = self._matcher_for(requests[i])
            if matcher is not None:
                matcher.fill_mask(bitmask, k)
            if matcher is None or not bitmask[k].any():
                for eos in self.eos_token_ids:
                    bitmask.view(np.uint32)[k, eos // 32] |= np.uint32(1 << (eos % 32))
        apply_bitmask(logits, bitmask, rows)

    def accept(self, requests: Sequence[ScheduledRequest], tokens: Sequence[int]) -> None:
        """Advance each constrained request's matcher by the token sampled for it."""
        for request, token in zip(requests, tokens, strict=True):
            if request.sampling.structured is None:
                continue
            state = self._states.get(request.request_id)
            if state is None or state.matcher is None:
                continue
            if not state.matcher.accept(token):
                log.warning(
                    "request %s: token %d refused by its %s constraint (%s); it ends here",
                    request.request_id,
                    token,
                    state.key[0],
                    state.matcher.error,
                )

    def matcher(self, request_id: str) -> Matcher | None:
        """The matcher of a request in flight (tests, diagnostics)."""
        state = self._states.get(request_id)
        return None if state is None else state.matcher

    def _matcher_for(self, request: ScheduledRequest) -> Matcher | None:
        """The request's matcher, having accepted exactly its outputs so far."""
        structured = request.sampling.structured
        assert structured is not None
        rid, key = request.request_id, (structured.kind, structured.spec)
        state = self._states.get(rid)
        if state is None or state.key != key:
            state = self._states[rid] = _State(key, self._new_matcher(request))
            while len(self._states) > self.max_matchers:
                self._states.popitem(last=False)
        self._states.move_to_end(rid)
        matcher, outputs = state.matcher, request.output_token_ids
        if matcher is None:
            return None
        count = len(matcher.tokens)
        if count != len(outputs) or (count and matcher.tokens[-1] != outputs[-1]):
            if not matcher.rebuild(outputs):
                log.warning(
                    "request %s: its output so far does not match its %s constraint (%s); it ends here",
                    rid,
                    key[0],
                    matcher.error,
                )
        return matcher

    def _new_matcher(self, request: ScheduledRequest) -> Matcher | None:
        structured = request.sampling.structured
        assert structured is not None
        try:
            return Matcher(self.compiler.compile(structured))
        except (InterlockError, OSError) as exc:
            log.warning(
                "request %s: its %s constraint cannot be enforced (%s); it ends here",
                request.request_id,
                structured.kind,
                exc,
            )
            return None
