"""Example 2 of the tutorial: a seq2seq model, the encoder on rank 0, the decoder on rank 1.

Run it with two ranks; by default it learns a built-in toy translation task
(reverse the words and look each up in a dictionary), offline::

    mpiexec -n 2 python examples/seq2seq/train_seq2seq.py

or give it a real parallel corpus, one sentence a line::

    mpiexec -n 2 python examples/seq2seq/train_seq2seq.py --source train.en \\
        --target train.fr --validation-source dev.en --validation-target dev.fr

The decoder rank computes the loss, so rank 1 logs, prints and plots loss,
perplexity and BLEU into ``--out`` and shows a few translations. At the end
every rank saves its part as ``OUT/model_rank{R}.npz``. ``--snapshot-interval``
and ``--resume auto`` work as in the MLP example.
"""
import argparse
import os
import sys
import time

import chainer
import numpy as np
from chainer.training import extensions

import mnpar

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# isort: split
import common  # noqa: E402  what the examples share (examples/common.py)
import corpus  # noqa: E402  this example's own modules, beside this script
import evaluation  # noqa: E402
import models  # noqa: E402

N_RANKS = 2
REPORTER = 1  # the decoder rank: it computes the loss


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", help="training source sentences (default: the toy corpus)")
    parser.add_argument("--target", help="their translations, line by line")
    parser.add_argument("--validation-source", help="validation source sentences")
    parser.add_argument("--validation-target", help="their translations")
    parser.add_argument("--toy-pairs", type=int, default=corpus.TOY_SIZES["train"],
                        help="training pairs of the toy corpus (default %(default)s)")
    parser.add_argument("--vocab", type=int, default=40000,
                        help="words per language, <unk> and <eos> included (default 40000)")
    parser.add_argument("--max-length", type=int, default=50,
                        help="longest sentence kept and translation made (default 50)")
    parser.add_argument("--epoch", "-e", type=int, default=10, help="epochs (default 10)")
    parser.add_argument("--batchsize", "-b", type=int, default=64, help="default 64")
    parser.add_argument("--unit", "-u", type=int, default=128, help="LSTM units (default 128)")
    parser.add_argument("--layer", "-l", type=int, default=1, help="LSTM layers (default 1)")
    parser.add_argument("--dropout", type=float, default=0.1,
                        help="dropout between LSTM layers (default 0.1)")
    parser.add_argument("--out", "-o", default=os.path.join("result", "seq2seq"),
                        help="output directory (default %(default)s)")
    common.add_run_options(parser)
    args = parser.parse_args(argv)
    files = [args.source, args.target, args.validation_source, args.validation_target]
    if any(files) and not all(files):
        parser.error("a real corpus needs all four of --source, --target, "
                     "--validation-source and --validation-target")
    common.check_options(parser, args, ("epoch", "batchsize", "unit", "layer", "vocab",
                                        "max_length", "toy_pairs"))
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must be in [0, 1), not {args.dropout}")
    return args


def reseed_every_iteration(seed, gpu):
    """An extension that reseeds from ``(seed, iteration)`` before every update.

    Dropout draws from the global generators, which a snapshot does not hold;
    reseeding them from the iteration makes a resumed run draw what the
    uninterrupted run drew.
    """
    def set_seed(trainer):
        iteration = trainer.updater.iteration
        common.reseed(int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0]), gpu)

    ext = chainer.training.make_extension(trigger=(1, "iteration"), initializer=set_seed,
                                          priority=chainer.training.PRIORITY_READER - 1)
    return ext(set_seed)


@chainer.dataset.converter()
def convert(batch, device):
    """A batch of variable-length id arrays as a tuple: the model is called as ``model(*xs)``."""
    return tuple(device.send(x) for x in batch)


def add_reporting(trainer):
    """Logs, prints and plots on the decoder rank; returns the plot files made."""
    return common.add_reporting(
        trainer, ["epoch", "iteration", "main/loss", "validation/main/loss", "main/perplexity",
                  "validation/main/perplexity", "validation/main/bleu", "elapsed_time"],
        {"loss.png": ["main/loss", "validation/main/loss"],
         "perplexity.png": ["main/perplexity", "validation/main/perplexity"],
         "bleu.png": ["validation/main/bleu"]})


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    comm, device = common.start(args, N_RANKS, "train_seq2seq.py",
                                "puts the encoder and the decoder on")
    if comm is None:
        return 2

    # Both ranks read both sides, so that both keep the same pairs in the same order.
    train_pairs, validation_pairs = corpus.load(args)
    source_vocab = corpus.Vocabulary([s for s, _ in train_pairs], args.vocab)
    target_vocab = corpus.Vocabulary([t for _, t in train_pairs], args.vocab)
    side = 0 if comm.rank == 0 else 1
    vocab = source_vocab if side == 0 else target_vocab
    train = [vocab.encode(pair[side]) for pair in train_pairs]
    validation = [vocab.encode(pair[side]) for pair in validation_pairs]

    model = models.build(comm, len(source_vocab), len(target_vocab), args.layer, args.unit,
                         args.dropout)
    model.to_device(device)
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    train_iter = chainer.iterators.SerialIterator(  # the same order on both ranks
        train, args.batchsize,
        order_sampler=mnpar.extensions.ResumableShuffleOrderSampler(args.seed))
    validation_iter = chainer.iterators.SerialIterator(validation, args.batchsize,
                                                       repeat=False, shuffle=False)
    updater = chainer.training.StandardUpdater(train_iter, optimizer, converter=convert,
                                               device=device)
    trainer = chainer.training.Trainer(updater, (args.epoch, "epoch"), out=args.out)
    trainer.extend(reseed_every_iteration(args.seed, args.gpu))
    # Both ranks evaluate and translate: each needs the other's half of the model.
    trainer.extend(extensions.Evaluator(validation_iter, model, converter=convert,
                                        device=device))
    bleu = evaluation.Bleu(comm, model, validation_pairs, (source_vocab, target_vocab),
                           max_length=args.max_length)
    trainer.extend(bleu)
    common.add_snapshots(comm, trainer, args)
    plots = []
    if comm.rank == REPORTER:
        plots = add_reporting(trainer)
        trainer.extend(evaluation.show_translations(bleu))

    resumed = common.resume(comm, trainer, args)
    if comm.rank == REPORTER:
        what = "the toy corpus" if args.source is None else args.source
        print(f"seq2seq on {what}: {len(train_pairs)} training and {len(validation_pairs)} "
              f"validation pairs, vocabularies {len(source_vocab)} and {len(target_vocab)}; "
              f"{comm.size} ranks ({comm.name} communicator, {device}); "
              + (f"resumed from iteration {resumed}" if resumed is not None
                 else "starting from iteration 0"), flush=True)
    trainer.run()

    path = os.path.join(args.out, f"model_rank{comm.rank}.npz")
    chainer.serializers.save_npz(path, model)
    comm.gather_obj(path)  # every rank has saved before the report
    if comm.rank == REPORTER:
        report(trainer, args.out, plots, time.perf_counter() - start)
    comm.finalize()
    return 0


def report(trainer, out, plots, seconds):
    log = trainer.get_extension("LogReport").log
    if log:
        last = log[-1]
        print(f"validation perplexity {last.get('validation/main/perplexity', float('nan')):.3f}"
              f", BLEU {last.get('validation/main/bleu', float('nan')):.4f} after "
              f"{last['epoch']} epochs, {seconds:.1f} s")
    print(f"log:    {os.path.join(out, 'log')}")
    for name in plots:
        print(f"plot:   {os.path.join(out, name)}")
    print(f"models: {os.path.join(out, 'model_rank{0,1}.npz')}")


if __name__ == "__main__":
    sys.exit(main())
