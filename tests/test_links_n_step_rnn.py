"""MultiNodeNStepRNN: the seq2seq encoder-decoder hand-off, every NStep variant.

The encoder (rank 0) sends its final states to the decoder (rank 1), which
starts from them; outputs and every parameter's gradient must equal the same
encoder-decoder run in one process.
"""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import mnpar

pytestmark = pytest.mark.mpi(min_size=1)
VARIANTS = [L.NStepLSTM, L.NStepBiLSTM, L.NStepGRU, L.NStepBiGRU, L.NStepRNNTanh,
            L.NStepBiRNNTanh, L.NStepRNNReLU, L.NStepBiRNNReLU]
TOL = dict(rtol=1e-10, atol=1e-12)


def rnn(cls, seed):
    with chainer.using_config("dtype", np.float64):
        np.random.seed(seed)
        link = cls(2, 3, 4, 0.0)
    link.cleargrads()
    return link


def sequences(seed, lengths=(4, 3, 2)):
    rng = np.random.RandomState(seed)
    return [rng.uniform(-1, 1, (n, 3)) for n in lengths]


def decoder_loss(ys):
    return sum(F.sum(y * np.random.RandomState(7 + i).uniform(-1, 1, y.shape))
               for i, y in enumerate(ys))


def assert_same_grads(part, ref):
    ref_params = dict(ref.namedparams())
    for name, p in part.namedparams():
        np.testing.assert_allclose(p.grad, ref_params[name].grad, err_msg=name, **TOL)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_seq2seq_hand_off_matches_one_process(mcomm, cls):
    enc, dec = rnn(cls, 1), rnn(cls, 2)
    xs, ts = sequences(3), sequences(4)
    enc_out = enc(*((None,) * enc.n_cells), xs)
    dec_out = dec(*enc_out[:-1], ts)
    decoder_loss(dec_out[-1]).backward()
    with chainer.using_config("train", True):
        if mcomm.rank == 0:
            part = mnpar.links.create_multi_node_n_step_rnn(copy.deepcopy(enc), mcomm,
                                                            rank_in=None, rank_out=1)
            part.cleargrads()
            *outs, delegate = part(xs)
            assert len(outs) == enc.n_cells + 1
            np.testing.assert_allclose(outs[0].array, enc_out[0].array, **TOL)
            delegate.backward()
            assert_same_grads(part.actual_rnn, enc)
        elif mcomm.rank == 1:
            part = mnpar.links.create_multi_node_n_step_rnn(copy.deepcopy(dec), mcomm,
                                                            rank_in=0, rank_out=None)
            part.cleargrads()
            *outs, delegate = part(ts)
            assert delegate is None
            for y, y_ref in zip(outs[-1], dec_out[-1]):
                np.testing.assert_allclose(y.array, y_ref.array, **TOL)
            decoder_loss(outs[-1]).backward()
            assert_same_grads(part.actual_rnn, dec)


@pytest.mark.mpi(min_size=2)
def test_tutorial_encoder_decoder_unpacking(mcomm):
    # The tutorial's shapes: ``c, h, _, phi = encoder(xs)``; ``c, h, os, _ = decoder(ys)``.
    if mcomm.rank == 0:
        enc = mnpar.links.create_multi_node_n_step_rnn(L.NStepLSTM(1, 3, 4, 0.1), mcomm,
                                                       rank_in=None, rank_out=1)
        c, h, _, phi = enc([x.astype(np.float32) for x in sequences(0)])
        phi.backward()
    elif mcomm.rank == 1:
        dec = mnpar.links.create_multi_node_n_step_rnn(L.NStepLSTM(1, 3, 4, 0.1), mcomm,
                                                       rank_in=0, rank_out=None)
        c, h, os, _ = dec([x.astype(np.float32) for x in sequences(1)])
        decoder_loss(os).backward()
        assert dec.actual_rnn.ws[0][0].grad is not None


def test_rejects_links_that_are_not_n_step_rnns(mcomm):
    with pytest.raises(ValueError, match="must be a chainer NStep RNN link .* not Linear"):
        mnpar.links.create_multi_node_n_step_rnn(L.Linear(3, 4), mcomm)
    with pytest.raises(ValueError, match=rf"rank_out={mcomm.size} is out of range"):
        mnpar.links.create_multi_node_n_step_rnn(L.NStepGRU(1, 3, 4, 0.0), mcomm,
                                                 rank_out=mcomm.size)
    rnn_link = mnpar.links.create_multi_node_n_step_rnn(L.NStepGRU(1, 3, 4, 0.0), mcomm)
    hy, ys, delegate = rnn_link([x.astype(np.float32) for x in sequences(0)])
    assert delegate is None and hy.shape == (1, 3, 4)
