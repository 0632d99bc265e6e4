from pathlib import Path

from interlock.bench.vocab import TokenizerVocab, WordVocab, load_vocab


def test_blocks_are_deterministic_across_instances(tokenizer_dir: Path) -> None:
    a, b = TokenizerVocab(tokenizer_dir), TokenizerVocab(tokenizer_dir)
    assert a.block("hash:512:7", 512) == b.block("hash:512:7", 512)
    assert a.block("hash:512:7", 512) != a.block("hash:512:8", 512)


def test_exact_text_reencodes_to_the_same_ids(tokenizer_dir: Path) -> None:
    vocab = TokenizerVocab(tokenizer_dir)
    ids = vocab.block("k", 300) + vocab.block("j", 200)
    text = vocab.text(ids)
    assert vocab.encode(text) == ids
    assert vocab.count(text) == 500


def test_word_vocab_is_approximate_and_deterministic() -> None:
    vocab = load_vocab(None)
    assert isinstance(vocab, WordVocab) and not vocab.exact
    ids = vocab.block("x", 100)
    assert vocab.block("x", 100) == ids
    assert vocab.count(vocab.text(ids)) == 100
