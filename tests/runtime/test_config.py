import pytest

from interlock.errors import ConfigError
from interlock.runtime import RuntimeConfig


def test_defaults() -> None:
    config = RuntimeConfig()
    assert (config.heartbeat_interval, config.lease_timeout) == (1.0, 5.0)
    assert config.request_plane == "tcp"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"heartbeat_interval": 2.0, "lease_timeout": 1.0}, "lease_timeout"),
        ({"peer_timeout": -1}, "peer_timeout"),
        ({"request_plane": "udp"}, "request_plane"),
    ],
)
def test_rejects_bad_values(fields: dict[str, object], param: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RuntimeConfig(**fields)  # type: ignore[arg-type]
    assert caught.value.param == param
