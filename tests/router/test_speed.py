from interlock.router.speed import StepTimeFit


def test_fit_recovers_overhead_and_per_token_cost() -> None:
    f = StepTimeFit()
    assert f.estimate() is None
    for tokens in (64, 512, 2048, 8192, 1024):
        f.add(tokens, 0.0165 + tokens * 1.5e-5)
    a, b = f.estimate()
    assert abs(a - 0.0165) < 1e-9 and abs(b - 1.5e-5) < 1e-12


def test_alike_steps_give_no_estimate() -> None:
    f = StepTimeFit()
    for _ in range(10):
        f.add(200, 0.02)
    assert f.estimate() is None
