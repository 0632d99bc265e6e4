"""One rank's part of a step: its micro-batches through its layers (driver and ranks alike).

Each rank builds its own inputs from the step's chunks (the same ``build_input`` as one
process), so only token ids and block tables cross the pipe. A first-stage rank embeds the
tokens; a later one receives the previous stage's hidden states. A stage that is not the
last sends its output on; the last stage's first tensor rank sends the wanted rows back to the
driver, which computes the logits (it holds the head and the sampler). With one stage the
driver's own output is the answer.
"""

from __future__ import annotations

import torch

from interlock.engine.model import LlamaModel, PagedKVCache, SequenceChunk, build_input
from interlock.engine.model.batch import ModelInput
from interlock.engine.model.partition import RankShard
from interlock.engine.parallel.comm import StageLink
from interlock.engine.parallel.messages import Step


class Stage:
    def __init__(
        self, model: LlamaModel, cache: PagedKVCache, shard: RankShard, link: StageLink | None
    ) -> None:
        assert shard.pipeline_size == 1 or link is not None, "stages talk through a link"
        self.model, self.cache, self.shard, self.link = model, cache, shard, link
        self.fused = model.fused_attention(cache.block_size)
        self.hidden = model.config.hidden_size

    @torch.inference_mode()
    def run(self, step: Step, built: ModelInput | None = None) -> list[torch.Tensor]:
        """The step through this rank's layers. On the driver: the wanted rows of each
        micro-batch's final hidden states (``built``: the inputs of a one-micro-batch step,
        already built); elsewhere nothing."""
        s, answers = self.shard, []
        t = s.tensor_size
        for tag, micro in enumerate(step.micro):
            inputs = built if built is not None and len(step.micro) == 1 else self._inputs(micro.chunks)
            n = inputs.input_ids.shape[0]
            if s.first_stage:
                h = self.model.embed(inputs.input_ids)
            else:
                assert self.link is not None
                h = self.link.recv((n, self.hidden), self.model.dtype, s.rank - t, tag, self.model.device)
            h = self.model.layers(h, inputs.positions, inputs.meta, self.cache)
            rows = torch.tensor(micro.rows, dtype=torch.long, device=self.model.device)
            if s.pipeline_size == 1:
                answers.append(h.index_select(0, rows))
            elif not s.last_stage:
                assert self.link is not None
                self.link.send(h, s.rank + t, tag)
            elif s.tensor_rank == 0:
                assert self.link is not None
                self.link.send(h.index_select(0, rows), 0, tag)
        if s.driver and s.pipeline_size > 1:
            assert self.link is not None
            last = (s.pipeline_size - 1) * t
            answers = [
                self.link.recv((len(m.rows), self.hidden), self.model.dtype, last, tag, self.model.device)
                for tag, m in enumerate(step.micro)
            ]
        if self.link is not None:
            self.link.flush()
        return answers if s.driver else []

    def _inputs(self, chunks: tuple[tuple[list[int], int, list[int]], ...]) -> ModelInput:
        return build_input(
            [SequenceChunk(ids, start, table) for ids, start, table in chunks],
            self.cache.block_size,
            self.model.device,
            fused=self.fused,
        )
