"""BLEU on the validation pairs: rank 0 encodes, rank 1 translates and scores.

BLEU is nltk's ``corpus_bleu`` (4-grams, smoothing method 1, so that early
translations with no 4-gram match score above zero). Both ranks run the
extension with the same trigger and walk the validation set in the same
batches; rank 1 reports ``validation/main/bleu`` and keeps a few examples,
which ``show_translations`` prints after the log line.
"""
import chainer
from chainer.training import extension
from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu


class Bleu(extension.Extension):
    """Translates the validation pairs and reports their BLEU (on the decoder rank)."""

    trigger = 1, "epoch"
    priority = extension.PRIORITY_WRITER

    def __init__(self, comm, model, pairs, vocabularies, batch_size=100, max_length=50,
                 n_examples=3):
        self.comm = comm
        self.model = model
        self.pairs = pairs
        self.source_vocab, self.target_vocab = vocabularies
        self.batch_size = batch_size
        self.max_length = max_length
        self.n_examples = n_examples
        self.examples = []

    def __call__(self, trainer):
        hypotheses = []
        for start in range(0, len(self.pairs), self.batch_size):
            batch = self.pairs[start:start + self.batch_size]
            if self.comm.rank == 0:
                xs = [self.source_vocab.encode(s) for s, _ in batch]
                self.model.encode([self.model.xp.asarray(x) for x in xs])
            else:
                ids = self.model.translate(len(batch), self.max_length)
                hypotheses += [self.target_vocab.decode(row) for row in ids]
        if self.comm.rank == 0:
            return
        references = [[t] for _, t in self.pairs]
        bleu = corpus_bleu(references, hypotheses,
                           smoothing_function=SmoothingFunction().method1)
        chainer.report({"validation/main/bleu": bleu})
        self.examples = [(source, target, hypothesis) for (source, target), hypothesis
                         in list(zip(self.pairs, hypotheses))[:self.n_examples]]


def show_translations(bleu):
    """An extension that prints ``bleu``'s examples, after PrintReport's line."""
    @extension.make_extension(trigger=bleu.trigger, priority=extension.PRIORITY_READER - 1)
    def show_translations(trainer):
        for source, target, hypothesis in bleu.examples:
            print(f"    source {' '.join(source)!r}, reference {' '.join(target)!r}, "
                  f"translation {' '.join(hypothesis)!r}", flush=True)

    return show_translations
