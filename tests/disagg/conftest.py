"""SmolLM2 fp32 fixtures shared by the identity tests (loaded once per session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def model() -> Iterator[object]:
    import torch

    from interlock.engine.model import LlamaModel
    from interlock.model_store import resolve_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # worker processes run with --threads 1: same reduction order
    yield LlamaModel.load(resolve_model("smollm2", progress=False), torch.float32, torch.device("cpu"), 1024)
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    from tests.disagg.test_identity import load_prompts

    return load_prompts()


@pytest.fixture(scope="session")
def expected(model: object, prompts: list[list[int]]) -> list[list[int]]:
    from tests.disagg.test_identity import aggregated, engine

    return aggregated(engine(model), prompts)  # type: ignore[arg-type]
