"""Parallel corpora for the seq2seq example: a built-in toy one, or text files.

The built-in corpus is a translation task with one right answer, so BLEU can
reach 1.0: a source sentence is 4 to 8 words of a tiny language, and its
translation is the same words in reverse order, each looked up in a fixed
dictionary::

    source: ka mo mo ri            target: tree dog dog cat

It is generated from a fixed seed, the same on every rank and every run,
and needs no download.

Real corpora are plain text, one sentence a line, words separated by spaces;
line ``i`` of the target file translates line ``i`` of the source file.
"""
import collections

import numpy as np

UNK, EOS = 0, 1
SPECIALS = ("<unk>", "<eos>")
DICTIONARY = {"ka": "cat", "mo": "dog", "ri": "tree", "su": "sun", "te": "tea",
              "no": "night", "ha": "leaf", "yu": "snow", "zo": "zoo", "pi": "pie"}
TOY_SIZES = {"train": 4000, "validation": 200}
TOY_LENGTHS = (4, 8)


def toy_pairs(split, size=None):
    """``[(source words, target words)]``: the first ``size`` pairs of the toy ``split``."""
    rng = np.random.RandomState({"train": 1, "validation": 2}[split])
    words = sorted(DICTIONARY)
    pairs = []
    for _ in range(TOY_SIZES[split] if size is None else size):
        n = rng.randint(TOY_LENGTHS[0], TOY_LENGTHS[1] + 1)
        source = [words[i] for i in rng.randint(len(words), size=n)]
        pairs.append((source, [DICTIONARY[w] for w in reversed(source)]))
    return pairs


def read_pairs(source_path, target_path, max_length):
    """Sentence pairs of two aligned text files; pairs with a side too long are dropped."""
    with open(source_path, encoding="utf-8") as f:
        sources = [line.split() for line in f]
    with open(target_path, encoding="utf-8") as f:
        targets = [line.split() for line in f]
    if len(sources) != len(targets):
        raise ValueError(f"{source_path!r} has {len(sources)} lines but {target_path!r} has "
                         f"{len(targets)}; line i of one must translate line i of the other")
    return [(s, t) for s, t in zip(sources, targets)
            if 0 < len(s) <= max_length and 0 < len(t) <= max_length]


class Vocabulary:
    """Word ids: ``<unk>`` 0, ``<eos>`` 1, then words by falling frequency."""

    def __init__(self, sentences, size):
        counts = collections.Counter(w for s in sentences for w in s)
        ranked = sorted(counts, key=lambda w: (-counts[w], w))[:max(size - len(SPECIALS), 0)]
        self.words = list(SPECIALS) + ranked
        self.ids = {w: i for i, w in enumerate(self.words)}

    def __len__(self):
        return len(self.words)

    def encode(self, words):
        return np.array([self.ids.get(w, UNK) for w in words], np.int32)

    def decode(self, ids):
        """Words of ``ids`` up to the first ``<eos>``."""
        words = []
        for i in ids:
            if int(i) == EOS:
                break
            words.append(self.words[int(i)])
        return words


def load(args):
    """``(train_pairs, validation_pairs)`` from ``args``: the toy corpus or four files."""
    files = [args.source, args.target, args.validation_source, args.validation_target]
    if not any(files):
        return toy_pairs("train", args.toy_pairs), toy_pairs("validation")
    return (read_pairs(args.source, args.target, args.max_length),
            read_pairs(args.validation_source, args.validation_target, args.max_length))
