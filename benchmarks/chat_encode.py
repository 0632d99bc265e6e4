"""What encoding a chat prompt costs the frontend, turn after turn (issue 31).

    PYTHONPATH=. .venv/bin/python benchmarks/chat_encode.py [--turns 10] [--conversations 200]

Each conversation is rendered with the model's own chat template, as the frontend renders it:
a system prompt, then ``--turns`` user and assistant messages of random words (lengths drawn per
message), then the next user message; every conversation is new (its system prompt too, unless
``--shared-system``). For each turn the prompt so far is encoded:

* **whole**: the tokenizer on the whole text (what the frontend did before);
* **cut**: ``ChunkedEncoder.cut_plan`` and ``fill``: the text cut at its added tokens (the
  template's turn markers), pieces found in the chunk cache or encoded (what it does now).

A conversation's turn i re-sends turns 0..i-1, so "cut" encodes only what is new since its last
request: the previous answer and the new question. Reported: CPU microseconds per request
(median over the conversations) at a few turn counts, and the ids checked equal.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from interlock.frontend.tokenizer import load_tokenizer
from interlock.machine import cpu_info
from interlock.model_store import resolve_model

WORDS = (
    "the of and to in is for on that with as was at by this from be are or an it which have has "
    "model cache token router worker prefix request latency stream block memory fleet queue"
).split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--shared-system", action="store_true", help="one system prompt for every conversation")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    tok = load_tokenizer(resolve_model("smollm2"))
    enc = tok.chunked
    template = tok.chat_template
    if enc is None or enc.cuts is None or template is None:
        raise SystemExit("this tokenizer has no exact cuts or no chat template")
    rng = random.Random(a.seed)
    shared = words(rng, 120)
    whole_us: dict[int, list[float]] = {t: [] for t in range(a.turns + 1)}
    cut_us: dict[int, list[float]] = {t: [] for t in range(a.turns + 1)}
    chars: dict[int, list[int]] = {t: [] for t in range(a.turns + 1)}
    clock = time.process_time
    for _ in range(a.conversations):
        messages: list[dict[str, str]] = [
            {"role": "system", "content": shared if a.shared_system else words(rng, 120)}
        ]
        for turn in range(a.turns + 1):
            messages.append({"role": "user", "content": words(rng, rng.randint(10, 80))})
            text = template.render(messages, add_generation_prompt=True)
            t0 = clock()
            want = tok.encode(text, add_special_tokens=False)
            t1 = clock()
            plan = enc.cut_plan(text)
            assert plan is not None
            got = enc.fill(plan)
            t2 = clock()
            assert list(got) == want, "cut ids differ from the whole text's"
            whole_us[turn].append((t1 - t0) * 1e6)
            cut_us[turn].append((t2 - t1) * 1e6)
            chars[turn].append(len(text))
            messages.append({"role": "assistant", "content": words(rng, rng.randint(20, 160))})
    print(f"CPU: {cpu_info()[0]}; {a.conversations} conversations, SmolLM2's tokenizer and template")
    print("| turn | prompt characters (median) | whole µs | cut µs | whole / cut |")
    print("|---:|---:|---:|---:|---:|")
    for turn in sorted({0, 1, 2, a.turns // 2, a.turns}):
        w, c = statistics.median(whole_us[turn]), statistics.median(cut_us[turn])
        print(f"| {turn} | {statistics.median(chars[turn]):,.0f} | {w:.0f} | {c:.0f} | {w / c:.1f}x |")


if __name__ == "__main__":
    main()
