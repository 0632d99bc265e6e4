import interlock.bench


def test_public_api_is_pinned() -> None:
    assert sorted(interlock.bench.__all__) == interlock.bench.__all__
    assert {
        "Endpoint",
        "run_load",
        "LoadPlan",
        "Bounds",
        "summarize",
        "Targets",
        "FakeOpenAIServer",
        "TracePrompts",
        "trace_plan",
        "report_png",
    } <= set(interlock.bench.__all__)
    for name in interlock.bench.__all__:
        assert hasattr(interlock.bench, name)
