"""Which GPU a rank takes (mnpar.communicators._devices), without a GPU: the environment
Slurm gives each task, and a communicator's intra_rank."""
from types import SimpleNamespace

import pytest

from mnpar.communicators._devices import device_count, gpu_index, gpu_of, visible_devices


def comm(intra_rank, rank=None):
    return SimpleNamespace(intra_rank=intra_rank, rank=intra_rank if rank is None else rank)


@pytest.mark.parametrize("value, names", [
    ("0", ["0"]), ("1", ["1"]), ("0,1,2,3", ["0", "1", "2", "3"]), (" 2, 3 ", ["2", "3"]),
    ("GPU-5d1c0a7e,GPU-9f22", ["GPU-5d1c0a7e", "GPU-9f22"]), ("", []), ("NoDevFiles", []),
    ("0,-1,1", ["0"]),
])
def test_the_visible_devices_are_read_as_cuda_reads_them(value, names):
    assert visible_devices({"CUDA_VISIBLE_DEVICES": value}) == names
    assert device_count({"CUDA_VISIBLE_DEVICES": value}) == len(names)


def test_no_variable_means_every_device_of_the_node():
    assert visible_devices({}) is None


# Slurm's two ways of giving a node's two GPUs to its two tasks (srun --ntasks-per-node=2):
# --gpus-per-task=1 shows each task its own (CUDA numbers it 0); --gpus-per-node=2 shows
# both to both. Each rank must end on a GPU of its own either way.
@pytest.mark.parametrize("environs", [
    [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}],
    [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "0,1"}],
    [{"CUDA_VISIBLE_DEVICES": "2,3"}, {"CUDA_VISIBLE_DEVICES": "2,3"}],
], ids=["per-task", "per-node", "per-node-offset"])
def test_each_rank_of_a_node_takes_a_device_of_its_own(environs):
    taken = [gpu_of(comm(r), environ=env) for r, env in enumerate(environs)]
    assert all(index < len(visible_devices(env)) for (index, _), env in zip(taken, environs))
    assert len({name for _, name in taken}) == len(environs), taken


def test_fewer_devices_than_ranks_are_shared_round_robin():
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert [gpu_index(comm(r), environ=env) for r in range(5)] == [0, 1, 0, 1, 0]


def test_intra_rank_alone_would_ask_for_a_device_the_rank_cannot_see():
    # Regression of the page's first advice, @cupy:{comm.intra_rank}: under
    # --gpus-per-task=1 the node's second task sees one device, numbered 0.
    assert gpu_index(comm(1), environ={"CUDA_VISIBLE_DEVICES": "1"}) == 0


def test_a_count_given_wins_and_names_fall_back_to_the_index():
    assert gpu_of(comm(3), count=2, environ={}) == (1, "1")


def test_a_rank_that_sees_no_device_is_refused():
    for value in ("", "NoDevFiles"):
        with pytest.raises(RuntimeError, match=r"gpu_index: rank 0 sees no GPU \("
                                               r"CUDA_VISIBLE_DEVICES=.*srun --gpus-per-task"):
            gpu_index(comm(0), environ={"CUDA_VISIBLE_DEVICES": value})


def test_something_without_an_intra_rank_is_refused():
    for bad in (object(), SimpleNamespace(intra_rank="0"), SimpleNamespace(intra_rank=True)):
        with pytest.raises(TypeError, match="gpu_index needs a communicator with an int "
                                            "intra_rank"):
            gpu_index(bad, count=1)
