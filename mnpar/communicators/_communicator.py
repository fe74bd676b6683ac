"""The communicator users hold: ChainerMN's names over mnpar's transport.

One class serves every named communicator; the name picks only the gradient
reduction strategy, a row of ``_strategies``. Point-to-point traffic,
collectives and objects all go through the private ``Transport``, so every
wait honours the timeout and mnpar never touches the user's own communicator.
"""
import os
from typing import Any, Dict, List, Optional, Tuple

import chainer
import numpy as np
from mpi4py import MPI
from numpy.typing import DTypeLike

from .._arrays import cupy_module, device_of, is_cupy_array, to_host
from .._failfast import failing
from . import _collectives as collectives
from . import _liveness as liveness
from . import _objects as objects
from ._internal import InternalApi
from ._model_checks import (
    check_link,
    check_same_model,
)
from ._strategies import strategy_of
from ._topology import discover, ranks_per_node_override
from ._transport import Transport
from ._wait import across_hosts, wait

DEFAULT_TIMEOUT = 600.0
ENV_TIMEOUT = "MNPAR_TIMEOUT"


def resolve_timeout(timeout: Optional[float]) -> Optional[float]:
    """The timeout argument, else ``MNPAR_TIMEOUT``, else the default; 0 means none."""
    if timeout is None:
        env = os.environ.get(ENV_TIMEOUT)
        try:
            timeout = float(env) if env else DEFAULT_TIMEOUT
        except ValueError:
            raise ValueError(f"{ENV_TIMEOUT}={env!r} must be a number of seconds") from None
    if timeout < 0:
        raise ValueError(f"timeout={timeout} must be positive (or 0 for no limit)")
    return None if timeout == 0 else float(timeout)


class Communicator(InternalApi):
    """A group of ranks that exchange arrays, objects and gradients.

    Create one with :func:`mnpar.create_communicator`. Every rank of
    ``mpi_comm`` must create it, in the same order as other collectives.

    Example::

        comm = mnpar.create_communicator("naive")
        if comm.rank == 0:
            comm.send(numpy.arange(3.0), dest=1)
        elif comm.rank == 1:
            x = comm.recv(source=0)
    """

    def __init__(self, mpi_comm: MPI.Comm, name: str, timeout: Optional[float] = None,
                 cuda_aware: bool = False, allreduce_grad_dtype: DTypeLike = None) -> None:
        self.strategy = strategy_of(name)
        self.strategy.reducer.check_config(allreduce_grad_dtype)  # before Dup: nothing to free
        self._mpi_comm = mpi_comm
        self._t = Transport(mpi_comm, resolve_timeout(timeout), cuda_aware)
        liveness.start(mpi_comm)  # the world's heartbeat, once per process
        self._topology = discover(self._t.comm)
        if self._topology.inter_size > 1 and ranks_per_node_override() is None:
            across_hosts()  # real hosts, not simulated ones: waits spin for the network
        self.name = name
        self._config: Dict[str, Any] = dict(timeout=timeout, cuda_aware=cuda_aware,
                                            allreduce_grad_dtype=allreduce_grad_dtype)
        self._reducer = self.strategy.reducer(self._t, self._topology, allreduce_grad_dtype)
        self._batched_copy = True
        self._fingerprints: Dict[Tuple[Any, ...], int] = {}  # gradient layout -> its checksum

    def __repr__(self) -> str:
        return f"<mnpar {self.name} communicator: rank {self.rank} of {self.size}>"

    # -- who is where --------------------------------------------------------

    @property
    def rank(self) -> int:
        """This rank's index in the communicator."""
        return self._t.rank

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self._t.size

    @property
    def intra_rank(self) -> int:
        """This rank's index among the ranks of its node."""
        return self._topology.intra.rank

    @property
    def intra_size(self) -> int:
        """The number of ranks on this rank's node."""
        return self._topology.intra.size

    @property
    def inter_rank(self) -> int:
        """The index of this rank's node."""
        return self._topology.inter_rank

    @property
    def inter_size(self) -> int:
        """The number of nodes."""
        return self._topology.inter_size

    @property
    def mpi_comm(self) -> MPI.Comm:
        """The user's MPI communicator (mnpar itself talks on a private duplicate)."""
        return self._mpi_comm

    @property
    def timeout(self) -> Optional[float]:
        """Seconds a wait may take before ``CommunicationTimeout``; None: forever."""
        return self._t.timeout

    def split(self, color: int, key: int) -> "Communicator":
        """A communicator of the same kind (and class) over the ranks that gave ``color``."""
        self._t.arrive("split")
        new = Communicator.__new__(type(self))
        Communicator.__init__(new, self._t.comm.Split(color, key), self.name, **self._config)
        new._batched_copy = self._batched_copy
        return new

    # -- configuration (ChainerMN's set_config/get_config) ----------------------

    @property
    def batched_copy(self) -> bool:
        """Accepted for ChainerMN compatibility: mnpar always packs gradients in one buffer."""
        return self._batched_copy

    @property
    def allreduce_grad_dtype(self) -> DTypeLike:
        """``pure_nccl``: the dtype gradients are reduced in (None: their own)."""
        return self._config["allreduce_grad_dtype"]

    def set_config(self, name: str, value: Any = True) -> None:
        """Sets ``'batched_copy'``, or ``'allreduce_grad_dtype'`` of ``pure_nccl``.

        Raises:
            ValueError: another name, or ``allreduce_grad_dtype`` on another communicator.
            TypeError: an ``allreduce_grad_dtype`` NCCL cannot sum.
        """
        if name == "batched_copy":
            self._batched_copy = bool(value)
        elif name == "allreduce_grad_dtype" and self.strategy.wire_dtype:
            self._reducer.set_wire_dtype(value)
            self._config["allreduce_grad_dtype"] = value
        elif name == "allreduce_grad_dtype":
            raise ValueError(f"allreduce_grad_dtype is supported by 'pure_nccl' only, not "
                             f"{self.name!r}")
        else:
            raise ValueError(f"unknown config {name!r}; valid: 'batched_copy', "
                             "'allreduce_grad_dtype' (pure_nccl)")

    def get_config(self, name: Optional[str] = None) -> Any:
        """The value of config ``name``, or a dict of every config where ``name`` is None.

        Raises:
            ValueError: an unknown name.
        """
        configs: Dict[str, Any] = {"batched_copy": self._batched_copy}
        if self.strategy.wire_dtype:
            configs["allreduce_grad_dtype"] = self._config["allreduce_grad_dtype"]
        if name is None:
            return configs
        if name not in configs:
            raise ValueError(f"unknown config {name!r}; valid: {sorted(configs)}")
        return configs[name]

    def finalize(self) -> None:
        """Ends the communicator and frees mnpar's MPI resources; collective.

        Every peer learns at once that this rank finished with the
        communicator (a wait for it fails with ``PeerFinished``); messages it
        sent here that nobody read are received, each with an
        ``UnreadMessageWarning``; a gradient mean still in flight (a double-buffered
        optimizer's last step) completes and is dropped. Called while an exception unwinds (a
        ``finally`` block), it only tells the peers that this rank failed and
        returns: no cleanup waits for a peer, so that the fail-fast abort runs.
        """
        if failing():
            self._t.free()  # the end notices only
            return
        self._reducer.complete_all()  # a double-buffered mean the optimizer left
        self._reducer.free()
        self._t.free()
        for c in (self._topology.intra, self._topology.leaders):
            if c is not None and c != MPI.COMM_NULL:
                c.Free()

    # -- arrays ----------------------------------------------------------------

    def send(self, data: Any, dest: int, tag: int = 0) -> None:
        """Sends an array or a tuple/list of arrays to rank ``dest``.

        A small message (up to 64 KiB) is sent without waiting for the
        receiver. A larger one is sent from the array's own memory and waits
        until ``dest`` receives it, as MPI's standard mode and ChainerMN do.

        Raises:
            ValueError: ``dest`` is out of range or this rank; ``tag`` out of range.
            TypeError: ``data`` is not an array or a tuple/list of arrays.
        """
        self._t.send(data, dest, tag)  # it checks ``dest`` and ``tag``, then frames

    def recv(self, source: int, tag: int = 0) -> Any:
        """Receives an array (or a tuple of arrays) sent by ``source`` with ``tag``."""
        return self._t.recv(source, tag)  # it checks ``source`` and ``tag``

    def bcast(self, data: Any, root: int = 0) -> Any:
        """``root``'s array on every rank; ``data`` is ignored elsewhere."""
        return collectives.bcast(self._t, data, root)

    def gather(self, data: Any, root: int = 0) -> Optional[Tuple[Any, ...]]:
        """A tuple of every rank's array on ``root``; None elsewhere."""
        return collectives.gather(self._t, data, root)

    def scatter(self, xs: Any, root: int = 0) -> Any:
        """``xs[i]`` of ``root`` on rank ``i``; ``xs`` is ignored on other ranks."""
        return collectives.scatter(self._t, xs, root)

    def allgather(self, x: Any) -> Tuple[Any, ...]:
        """A tuple of every rank's array on every rank."""
        return collectives.allgather(self._t, x)

    def alltoall(self, xs: Any) -> Tuple[Any, ...]:
        """Sends ``xs[j]`` to rank ``j``; returns what every rank sent here."""
        return collectives.alltoall(self._t, xs)

    def allreduce(self, x: Any) -> Any:
        """The sum over ranks of ``x`` (same dtype and shape everywhere)."""
        return collectives.allreduce(self._t, x)

    # -- objects (pickled) -------------------------------------------------------

    def send_obj(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Sends a picklable object to ``dest`` without waiting for its receiver."""
        objects.send_obj(self._t, obj, dest, tag)

    def recv_obj(self, source: int, status: Optional[MPI.Status] = None,
                 tag: int = MPI.ANY_TAG) -> Any:
        """Receives an object that ``send_obj`` sent from ``source``.

        Args:
            source: the sender's rank.
            status: an ``MPI.Status`` that gets the message's source and tag.
            tag: the tag to match; any tag by default, as ChainerMN.
        """
        return objects.recv_obj(self._t, source, tag, status)

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        """Root's object, on every rank (``obj`` is ignored elsewhere)."""
        root = self._t.routes.check_peer(root, "root", allow_self=True)
        self._t.arrive("bcast_obj")
        return self._t.comm.bcast(obj, root)

    def gather_obj(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        """Every rank's object in rank order on ``root``; None elsewhere."""
        root = self._t.routes.check_peer(root, "root", allow_self=True)
        self._t.arrive("gather_obj")
        return self._t.comm.gather(obj, root)

    def allgather_obj(self, obj: Any) -> List[Any]:
        """Every rank's object in rank order, on every rank."""
        self._t.arrive("allgather_obj")
        return self._t.comm.allgather(obj)

    def allreduce_obj(self, obj: Any) -> Any:
        """The sum (``+``) of every rank's object."""
        self._t.arrive("allreduce_obj")
        return self._t.comm.allreduce(obj)

    # -- models ------------------------------------------------------------------

    def bcast_data(self, model: chainer.Link) -> None:
        """Copies rank 0's parameters into every rank's ``model``, in place.

        Raises:
            ValueError: on every rank, if the models' parameters (names,
                shapes, dtypes) differ across ranks.
        """
        check_link(model, "bcast_data")
        params = sorted(model.namedparams(), key=lambda item: item[0])
        layout = [(n, None if p.data is None else (p.data.shape, str(p.data.dtype)))
                  for n, p in params]
        check_same_model(self.allgather_obj(layout), "bcast_data")
        groups: Dict[np.dtype, List[chainer.Parameter]] = {}
        for _, p in params:
            if p.data is not None:
                groups.setdefault(p.data.dtype, []).append(p)
        for group in groups.values():
            self._bcast_group(group)

    def _bcast_group(self, group: List[chainer.Parameter]) -> None:
        host = [to_host(p.data) for p in group]
        buf = (np.concatenate([h.ravel() for h in host]) if self.rank == 0
               else np.empty(sum(h.size for h in host), host[0].dtype))
        wait([self._t.comm.Ibcast([buf, MPI.BYTE], 0)], self._t.timeout,
             self._t.describe("bcast_data", 0, None, "rank 0's parameters"), nbytes=buf.nbytes)
        offset = 0
        for p, h in zip(group, host):
            part = buf[offset: offset + h.size].reshape(h.shape)
            offset += h.size
            data: Any = p.data  # (set: ``bcast_data`` groups parameters with data only)
            if is_cupy_array(data):
                with device_of(data):  # uploaded to the parameter's own GPU
                    data[...] = cupy_module().asarray(part)
            else:
                data[...] = part

    def multi_node_mean_grad(self, model: chainer.Link, zero_fill: bool = False) -> None:
        """Replaces every gradient of ``model`` with its mean over all ranks.

        Args:
            model: a ``chainer.Link``; every rank must hold the same parameters.
            zero_fill: treat a missing gradient as zeros (else skip that parameter,
                which every rank must then skip too).
        """
        self.finish_mean_grad(self.start_mean_grad(model, zero_fill))

    allreduce_grad = multi_node_mean_grad  # ChainerMN's older name
    broadcast_data = bcast_data  # ChainerMN's older name


CommunicatorBase = Communicator  # ChainerMN's name for the interface


def require_communicator(comm: object, op: str) -> None:
    """Raises ``TypeError`` naming ``op`` unless ``comm`` is an mnpar communicator."""
    if not isinstance(comm, Communicator):
        raise TypeError(f"{op} needs an mnpar communicator, not {type(comm).__name__}; "
                        "wrap an mpi4py one with mnpar.create_communicator(mpi_comm=...)")
