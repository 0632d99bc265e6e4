"""The public API of interlock.runtime is pinned: changing it is a deliberate act."""

import interlock.runtime


def test_public_names() -> None:
    assert sorted(interlock.runtime.__all__) == [
        "CallContext",
        "Discovery",
        "DiscoveryEvent",
        "EndpointName",
        "EventPlane",
        "Handler",
        "InProcRegistry",
        "NatsAuth",
        "NatsServer",
        "RequestPlane",
        "Runtime",
        "RuntimeConfig",
        "Subscription",
        "connect_runtime",
        "generate_auth",
        "subject_matches",
    ]
    for name in interlock.runtime.__all__:
        assert getattr(interlock.runtime, name) is not None
