"""Save at N, load at M: every pair of rank counts in {1, 2, 3, 4}, every layout.

Layouts of one model (a Sequential of 8 Linear layers of uneven sizes) with
Adam: plain data parallelism, sharded stages 1, 2 and 3, pipeline stages
(``build_stage``, one part per rank), the same model split another way
(two interleaved parts per rank) and ``MultiNodeChainList`` pieces (a rank's
layers as one component, wired to its neighbours). Each saving layout fills every array it
holds with values that are a function of the array's global name and each
element's global position, so a rank of any loading layout knows what each
of its shards must hold after the load: bit for bit. Each checkpoint loads
into its own layout at every M, and into each other layout at one M (another
for each N).
"""
import os
import shutil
import tempfile
import zlib

import chainer
import chainer.links as L
import numpy as np
import pytest

import mnpar
from mnpar.checkpoint import holdings
from mnpar.pipeline import build_stage

pytestmark = pytest.mark.mpi(min_size=1)
SIZES = [3, 5, 4, 6, 2, 5, 3, 4, 3]  # 8 layers; no rank count from 2 to 4 divides them all
LAYOUTS = ["plain", "stage1", "stage2", "stage3", "pipeline", "chunks", "chain_list"]


@pytest.fixture(scope="module")
def world():
    c = mnpar.create_communicator("naive", timeout=30)
    yield c
    c.finalize()


@pytest.fixture(scope="module")
def comms(world):
    """n -> the communicator of world ranks 0..n-1 (None on the others), n up to 4."""
    made, out = [], {}
    for n in range(1, min(world.size, 4) + 1):
        sub = world.split(int(world.rank >= n), world.rank)
        made.append(sub)
        out[n] = sub if world.rank < n else None
    yield out
    for sub in made:
        sub.finalize()


@pytest.fixture(scope="module")
def root(world):
    path = world.bcast_obj(tempfile.mkdtemp(prefix="mnpar-ckpt-") if world.rank == 0 else None)
    yield path
    world.allgather_obj(None)
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def whole_model(seed):
    np.random.seed(seed)
    return chainer.Sequential(*[L.Linear(a, b) for a, b in zip(SIZES, SIZES[1:])])


def balance(parts):
    base, extra = divmod(len(SIZES) - 1, parts)
    return [base + (i < extra) for i in range(parts)]


def build(layout, comm, seed):
    """(optimizer, names) of ``layout`` on ``comm``, after one update (the states exist)."""
    whole = whole_model(seed)
    if layout.startswith("stage") or layout == "plain":
        stage = 0 if layout == "plain" else int(layout[-1])
        opt = mnpar.create_multi_node_optimizer(chainer.optimizers.Adam(), comm, stage=stage)
        opt.setup(whole)
        names = None
    elif layout == "chain_list":
        first = sum(balance(comm.size)[:comm.rank])
        mine = list(whole)[first:first + balance(comm.size)[comm.rank]]
        piece = mnpar.links.MultiNodeChainList(comm)
        piece.add_link(chainer.Sequential(*mine), rank_in=comm.rank - 1 if comm.rank else None,
                       rank_out=comm.rank + 1 if comm.rank < comm.size - 1 else None)
        opt = chainer.optimizers.Adam().setup(piece)
        names = whole
    else:
        chunks = 2 if layout == "chunks" else 1
        piece = build_stage(whole, balance(comm.size * chunks), comm, loop=False, chunks=chunks)
        opt = chainer.optimizers.Adam().setup(piece)
        names = whole
    opt.update()
    return opt, names


def fill(name, shape, box, flat, dtype):
    """The elements ``flat`` of block ``box`` of the array ``name``: a function of the name
    and of each element's global position."""
    rng = np.random.RandomState(zlib.crc32(name.encode()))
    whole = rng.standard_normal(shape).astype(dtype)
    block = whole if box is None else whole[tuple(slice(a, b) for a, b in box)]
    return block.reshape(-1)[flat[0]:flat[1]]


def counters(name):
    return 7 + zlib.crc32(name.encode()) % 100


def prepare(opt, names):
    h = holdings(opt, names, split=False)
    for part in h.parts:
        part.array.reshape(-1)[...] = fill(part.name, part.shape, part.box, part.flat,
                                           part.dtype)
    for name, held in h.values.items():
        if held.assign is not None and name.startswith("optimizer:"):
            held.assign(counters(name))


def verify(opt, names, where):
    h = holdings(opt, names, split=False)
    for part in h.parts:
        want = fill(part.name, part.shape, part.box, part.flat, part.dtype)
        assert np.array_equal(part.array.reshape(-1), want), (where, part.name)
    for name, held in h.values.items():
        if name.startswith("optimizer:"):
            assert held.value == counters(name), (where, name, held.value)


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.mpi(min_size=2)),
                               pytest.param(3, marks=pytest.mark.mpi(min_size=3)),
                               pytest.param(4, marks=pytest.mark.mpi(min_size=4))])
@pytest.mark.parametrize("saved", LAYOUTS)
def test_save_at_n_loads_at_every_m_in_every_layout(world, comms, root, saved, n):
    path = os.path.join(root, f"{saved}-{n}")
    if comms[n] is not None:
        opt, names = build(saved, comms[n], seed=0)
        prepare(opt, names)
        mnpar.checkpoint.save(path, comms[n], opt, names=names)
    world.allgather_obj(None)  # saved before any rank loads
    sizes = sorted(comms)
    for i, layout in enumerate(LAYOUTS):
        # its own layout at every m; each other layout at one m, another for each n
        for m in sizes if layout == saved else [sizes[(i + n) % len(sizes)]]:
            comm = comms[m]
            if comm is None:
                continue
            opt, names = build(layout, comm, seed=1)
            mnpar.checkpoint.load(path, comm, opt, names=names)
            verify(opt, names, f"saved {saved} at {n}, loaded {layout} at {m}")
            if layout == "stage3":  # the load gathered no whole parameter
                assert all(p.array is None for p in opt.target.params())
