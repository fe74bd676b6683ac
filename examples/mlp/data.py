"""The MLP's data: scikit-learn's digits (bundled, no download) or MNIST.

Only rank 0 reads data; rank 1 needs just the lengths, for its empty datasets.
"""
import chainer
import numpy as np

DATASETS = ("digits", "mnist")
N_CLASSES = 10
DIGITS_VALIDATION = 360  # of 1797 images; the split is fixed, whatever --seed says


def load(name):
    """``(train, validation)`` TupleDatasets of (float32 image in [0, 1], int32 label)."""
    if name == "digits":
        return _digits()
    if name == "mnist":
        return chainer.datasets.get_mnist()  # downloads once into chainer's dataset root
    raise ValueError(f"unknown dataset {name!r}; choose one of {DATASETS}")


def _digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # 8x8 pixels, 0..16
    t = digits.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(x))
    val, train = order[:DIGITS_VALIDATION], order[DIGITS_VALIDATION:]
    return (chainer.datasets.TupleDataset(x[train], t[train]),
            chainer.datasets.TupleDataset(x[val], t[val]))
