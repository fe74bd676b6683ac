"""Which GPU a rank takes: its place on its node, among the devices it can see.

A batch system may show each rank every GPU of its node, or only its own.
Slurm's ``srun --gpus-per-task=1`` gives each task its own device and says so
in ``CUDA_VISIBLE_DEVICES`` (CUDA then numbers it 0), while
``--gpus-per-node`` shows every task of the node all of them::

    srun --ntasks-per-node=2 ...   task  intra_rank  CUDA_VISIBLE_DEVICES  sees  takes
    --gpus-per-task=1              0     0           0                     1     0 (GPU 0)
                                   1     1           1                     1     0 (GPU 1)
    --gpus-per-node=2              0     0           0,1                   2     0 (GPU 0)
                                   1     1           0,1                   2     1 (GPU 1)
    (no GPU option: variable unset; cupy counts the node's GPUs)

``intra_rank % count``, with ``count`` the devices this rank sees, gives
every rank a device of its own in each case, and shares them round robin
where a node has fewer devices than ranks. ``intra_rank`` alone would ask
for device 1 where a rank sees one device. The count is read from
``CUDA_VISIBLE_DEVICES`` where it is set (no GPU needed to compute the
mapping: the cluster tests check it with Slurm's pretend GPUs), else from
cupy.
"""
import os
from typing import Any, List, Mapping, Optional, Tuple

VARIABLE = "CUDA_VISIBLE_DEVICES"


def visible_devices(environ: Optional[Mapping[str, str]] = None) -> Optional[List[str]]:
    """The devices ``CUDA_VISIBLE_DEVICES`` names (``[]`` for none), or None where unset."""
    value = (os.environ if environ is None else environ).get(VARIABLE)
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    # Slurm writes NoDevFiles for a job whose GPUs have no device files; CUDA stops at a -1.
    if "NoDevFiles" in names:
        return []
    return names[:names.index("-1")] if "-1" in names else names


def device_count(environ: Optional[Mapping[str, str]] = None) -> int:
    """How many CUDA devices this process sees: ``CUDA_VISIBLE_DEVICES``, else cupy's count."""
    names = visible_devices(environ)
    if names is not None:
        return len(names)
    try:
        import cupy
    except ImportError as error:
        raise RuntimeError(f"gpu_index: {VARIABLE} is unset and cupy is missing ({error}): "
                           "nothing says how many GPUs this rank sees") from None
    return int(cupy.cuda.runtime.getDeviceCount())


def gpu_index(comm: Any, count: Optional[int] = None,
              environ: Optional[Mapping[str, str]] = None) -> int:
    """The CUDA device this rank should use, as an index among the devices it sees.

    Args:
        comm: the mnpar communicator (its ``intra_rank``).
        count: the devices this rank sees; default ``device_count()``.
        environ: the environment to read (default ``os.environ``).

    Returns:
        int: ``comm.intra_rank % count``: each rank of a node a device of its own
        whether the batch system shows it one GPU or all of the node's.

    Raises:
        TypeError: ``comm`` has no int ``intra_rank``.
        RuntimeError: this rank sees no device.

    Example::

        comm = mnpar.create_communicator()
        device = chainer.get_device(f"@cupy:{mnpar.communicators.gpu_index(comm)}")
    """
    return gpu_of(comm, count, environ)[0]


def gpu_of(comm: Any, count: Optional[int] = None,
           environ: Optional[Mapping[str, str]] = None) -> Tuple[int, str]:
    """``(index, name)``: ``gpu_index`` and the device's name in ``CUDA_VISIBLE_DEVICES``
    (its index again where the variable is unset), which tells ranks' devices apart."""
    intra_rank = getattr(comm, "intra_rank", None)
    if not isinstance(intra_rank, int) or isinstance(intra_rank, bool):
        raise TypeError(f"gpu_index needs a communicator with an int intra_rank, not "
                        f"{type(comm).__name__}")
    if count is None:
        count = device_count(environ)
    if count < 1:
        value = (os.environ if environ is None else environ).get(VARIABLE)
        raise RuntimeError(f"gpu_index: rank {getattr(comm, 'rank', '?')} sees no GPU "
                           f"({VARIABLE}={value!r}); ask the batch system for GPUs (srun "
                           "--gpus-per-task=1) or run on the CPU")
    index = intra_rank % count
    names = visible_devices(environ)
    return index, (names[index] if names is not None and index < len(names) else str(index))
