"""The Python API with the real model: the README's example as written, then chat, async,
streaming, sampling parameters and refusals on one cluster (a real worker process)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import interlock
from interlock.errors import ConfigError, InvalidRequest

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_example_runs_and_prints_text_from_smollm2() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(readme_example(), str(README), "exec"), {})
    assert out.getvalue().strip()  # some text (sampled: temperature 1 as in OpenAI's API)


def test_public_api_is_pinned() -> None:
    assert sorted(interlock.__all__) == ["Cluster", "ServingInstance", "__version__"]
    assert interlock.Cluster.__name__ == "Cluster"


@pytest.fixture(scope="module")
def instance() -> Iterator[interlock.ServingInstance]:
    with interlock.Cluster.local(http_port=0) as cluster:
        cluster.register_model("tiny", "smollm2", max_model_len=1024)
        yield cluster.create_serving_instance(model="tiny", max_replicas=2, num_blocks=256)


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_stream_and_async_agree_under_greedy_sampling(instance: interlock.ServingInstance) -> None:
    text = instance.chat(QUESTION, max_tokens=16, temperature=0)
    assert "Paris" in text
    assert "".join(instance.stream(messages=QUESTION, max_tokens=16, temperature=0)) == text

    async def both() -> tuple[str, str]:
        pieces = [p async for p in instance.astream(messages=QUESTION, max_tokens=16, temperature=0)]
        return await instance.achat(QUESTION, max_tokens=16, temperature=0), "".join(pieces)

    assert asyncio.run(both()) == (text, text)


def test_prompts_and_sampling_parameters(instance: interlock.ServingInstance) -> None:
    seeded = [instance.generate("Once upon a time", max_tokens=12, temperature=1.0, seed=7) for _ in range(2)]
    assert seeded[0] == seeded[1] and seeded[0]
    assert (
        asyncio.run(instance.agenerate("Once upon a time", max_tokens=12, temperature=1.0, seed=7))
        == seeded[0]
    )
    stopped = instance.generate("1, 2, 3, 4, 5, 6,", max_tokens=20, temperature=0, stop=["9"])
    assert "9" not in stopped
    assert instance.generate([1, 2, 3], max_tokens=2) is not None  # token ids as the prompt


def test_bad_input_is_refused_by_name(instance: interlock.ServingInstance) -> None:
    with pytest.raises(InvalidRequest, match="frequency_penalty|temprature"):
        instance.generate("hi", temprature=0.5)
    for fields in ({"n": 2}, {"logprobs": 1}, {"echo": True}):  # the text alone cannot carry them
        with pytest.raises(InvalidRequest) as info:
            instance.generate("hi", **fields)
        assert info.value.param == next(iter(fields))
    assert instance.generate("hi", max_tokens=2, n=1, echo=False) is not None
    with pytest.raises(InvalidRequest) as info:  # a bad constraint is refused before any work
        instance.generate("hi", structured_outputs={"regex": "(unclosed"})
    assert info.value.param == "structured_outputs"
    answer = instance.generate("Is the sky blue?", structured_outputs={"choice": ["yes", "no"]}, max_tokens=5)
    assert answer in ("yes", "no")  # enforced by the engine's grammar
    with pytest.raises(ConfigError, match="max_replicas"):
        instance.scale_to(3)
    cluster = instance.cluster
    cluster.register_model("big", "smollm2", tensor_parallel_size=10)
    with pytest.raises(ConfigError, match="tensor_parallel_size 10 exceeds the model's 9 attention heads"):
        cluster.create_serving_instance("big")  # refused before any worker starts
    with pytest.raises(ConfigError, match="colocate: 'nope' is not another registered model"):
        cluster.create_serving_instance("tiny", colocate=["nope"])
    with pytest.raises(ConfigError, match="model: 'nope' is not registered"):
        cluster.create_serving_instance(model="nope")
    with pytest.raises(ConfigError, match="register_model: unknown colour"):
        cluster.register_model("x", "smollm2", colour="red")
    with pytest.raises(ConfigError, match="engine_args: vLLM's engine arguments need engine: vllm"):
        cluster.register_model("x", "smollm2", engine_args={"enforce_eager": True})
    # vLLM's arguments as a dict, as docs/vllm.md shows (nothing starts until an instance does)
    cluster.register_model("v", "smollm2", engine="vllm", engine_args={"enforce-eager": True})
    assert cluster._models["v"].engine_args == (("enforce_eager", True),)


def test_connect_joins_a_running_deployment(instance: interlock.ServingInstance) -> None:
    local = instance.cluster.running
    with interlock.Cluster.connect(local.url, cluster_secret=local.secret, nats_auth=local.auth) as joined:
        service = joined.running.service
        assert joined.call(service.wait_for_workers(1, 15)) == 1
        assert [m.name for m in service.models()] == ["tiny"]
        assert joined.running.nats is None  # it started no nats-server of its own


def test_http_port_serves_the_openai_api_too(instance: interlock.ServingInstance) -> None:
    import openai

    url = instance.cluster.http_url
    assert url is not None and url.startswith("http://127.0.0.1:")
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == instance.chat(QUESTION, max_tokens=16, temperature=0)


def test_two_models_in_one_worker_process_through_the_api(instance: interlock.ServingInstance) -> None:
    cluster = instance.cluster
    cluster.register_model("host", "smollm2", max_model_len=512)
    cluster.register_model("guest", "smollm2", max_model_len=512, offload_after_s=60)
    host = cluster.create_serving_instance("host", colocate={"guest": {"num_blocks": 64}}, num_blocks=64)
    guest = host.colocated("guest")
    assert guest.workers == host.workers and len(host.workers) == 1  # one process, two engines
    both = [i.chat(QUESTION, max_tokens=8, temperature=0) for i in (host, guest)]
    assert both[0] == both[1] == instance.chat(QUESTION, max_tokens=8, temperature=0)
    with pytest.raises(ConfigError, match="'tiny' is not hosted by the workers of 'host'"):
        host.colocated("tiny")
    with pytest.raises(ConfigError, match="scale_to: 'guest' lives in the workers of 'host'"):
        guest.scale_to(2)
    host.scale_to(0)
