from pathlib import Path

from interlock.bench.lengths import LengthDist
from interlock.bench.prompts import SyntheticSpec, synthetic_prompt
from interlock.bench.vocab import TokenizerVocab


def test_shared_prefix_groups_share_exact_ids(tokenizer_dir: Path) -> None:
    vocab = TokenizerVocab(tokenizer_dir)
    spec = SyntheticSpec(
        LengthDist.parse("uniform:100:150"), LengthDist.parse("32"), prefix_len=64, prefix_groups=3
    )
    prompts = [synthetic_prompt(spec, vocab, i) for i in range(6)]
    for p in prompts:
        assert p.token_ids is not None and len(p.token_ids) == p.input_tokens and p.max_tokens == 32
        assert vocab.encode(p.text) == list(p.token_ids)
    assert prompts[0].token_ids[:64] == prompts[3].token_ids[:64]  # type: ignore[index]
    assert prompts[0].token_ids[:64] != prompts[1].token_ids[:64]  # type: ignore[index]
    assert prompts[0].token_ids[64:70] != prompts[3].token_ids[64:70]  # type: ignore[index]
    assert synthetic_prompt(spec, vocab, 4) == prompts[4]
