"""An evaluator for results that cannot simply be averaged over ranks.

Each rank walks its own iterator and computes ``calc_local`` per batch; the
results travel to the root, which calls ``aggregate`` once on all of them
(e.g. to compute a ranking metric over the whole test set). The ranks may
hold different numbers of batches; they gather one result each per round,
None once they are done, and every 8 rounds the root tells them whether all
are done (ChainerMN's protocol, so ``aggregate`` sees the same list)::

    round    rank 0   rank 1   root's list so far
      1       r0a      r1a     [r0a, r1a]
      2       r0b      None    [r0a, r1a, r0b]
     ...      None     None    (the 8th round: all done -> stop)

A rank whose ``calc_local`` raises sends a failure marker instead, stops
computing, and every rank raises after the next 8-round check, so no rank
waits for a peer that failed.
"""
import copy
from typing import Any, Dict, List, Optional, Tuple

from chainer import backend, function
from chainer.dataset import convert
from chainer.training import extension

from ..communicators._facade import Communicator, require_communicator

GATHER_INTERVAL = 8  # rounds between the root's "all done?" broadcasts


class _Failed:
    """What a rank whose ``calc_local`` raised sends in place of a result."""

    def __init__(self, text: str) -> None:
        self.text = text


class GenericMultiNodeEvaluator(extension.Extension):
    """Evaluates on every rank and aggregates the per-batch results on the root.

    Override ``calc_local`` (one batch's result on this rank; by default the
    target's output) and ``aggregate`` (all ranks' results, on the root; by
    default the list itself). Calling the extension is collective; it
    returns ``aggregate``'s value on the root and None elsewhere. Nothing is
    reported automatically: report from ``aggregate`` if needed.

    Args:
        comm: the mnpar communicator.
        iterator: this rank's test iterator; it must not repeat.
        target: the model ``calc_local`` calls by default.
        device: where the converter sends the batch; default where it is.
        converter: turns a batch into the arguments of ``calc_local``
            (a tuple: positional, a dict: keywords).
        root: the rank that aggregates.
        progress_hook: a function of each batch, called on the root.

    Raises:
        TypeError: ``comm`` is not an mnpar communicator, ``root`` not an
            int, or an unknown keyword argument.
        ValueError: ``root`` out of range.

    Example::

        class Top1(mnpar.extensions.GenericMultiNodeEvaluator):
            def calc_local(self, x, t):
                return int((self._targets["main"](x).array.argmax(axis=1) == t).sum()), len(t)

            def aggregate(self, results):
                right, total = map(sum, zip(*results))
                chainer.report({"validation/top1": right / total})

        trainer.extend(Top1(comm, test_iter, model))
    """

    trigger = 1, "epoch"
    default_name = "validation"
    priority = extension.PRIORITY_WRITER
    name = None
    comm: Communicator
    iterator: Any
    converter: Any
    device: Any
    root: int
    _targets: Dict[str, Any]
    _progress_hook: Any

    def __init__(self, comm: Communicator, iterator: Any, target: Any, device: Any = None,
                 converter: Any = convert.concat_examples, root: int = 0, **kwargs: Any) -> None:
        require_communicator(comm, "GenericMultiNodeEvaluator")
        unknown = sorted(set(kwargs) - {"progress_hook"})
        if unknown:
            raise TypeError(f"GenericMultiNodeEvaluator got unknown keyword(s) {unknown}")
        self.comm = comm
        self.iterator = iterator
        self._targets = {"main": target}
        self.converter = converter
        self.device = None if device is None else backend.get_device(device)
        self._progress_hook = kwargs.get("progress_hook")
        self.root = comm.check_peer(root, "root", allow_self=True)

    def __call__(self, trainer: Any = None) -> Any:
        if hasattr(self.iterator, "reset"):
            self.iterator.reset()
            it = self.iterator
        else:
            it = copy.copy(self.iterator)
        results = self._gather_results(it)
        return self.aggregate(results) if self.comm.rank == self.root else None

    def calc_local(self, *args: Any, **kwargs: Any) -> Any:
        """One batch's result on this rank; by default the target's output.

        Args:
            args: the converter's result, if a tuple (or a single value).
            kwargs: the converter's result, if a dict.

        Returns:
            Any picklable value except None.
        """
        return self._targets["main"](*args, **kwargs)

    def aggregate(self, results: List[Any]) -> Any:
        """Combines every rank's results, once, on the root; by default returns them.

        Args:
            results: the ``calc_local`` results of all ranks, round by round
                and in rank order within a round.
        """
        return results

    def _calc(self, batch: Any) -> Any:
        in_arrays = convert._call_converter(self.converter, batch, self.device)
        with function.no_backprop_mode():
            if isinstance(in_arrays, tuple):
                return self.calc_local(*in_arrays)
            if isinstance(in_arrays, dict):
                return self.calc_local(**in_arrays)
            return self.calc_local(in_arrays)

    def _next_result(self, iterator: Any) -> Tuple[Any, bool, Optional[BaseException]]:
        """This round's result, whether the iterator is exhausted, and ``calc_local``'s error."""
        try:
            batch = iterator.next()
        except StopIteration:
            return None, True, None
        try:
            result = self._calc(batch)
        except Exception as e:
            return _Failed(f"{type(e).__name__}: {e}"), True, e
        if self.comm.rank == self.root and self._progress_hook:
            self._progress_hook(batch)
        return result, False, None

    def _gather_results(self, iterator: Any) -> List[Any]:
        """Every rank's results on the root (an empty list elsewhere); collective."""
        results: List[Any] = []
        done, error = False, None
        while True:
            failures: List[Tuple[int, str]] = []
            last_round_empty = True
            for _ in range(GATHER_INTERVAL):
                result = None
                if not done:
                    result, done, error = self._next_result(iterator)
                gathered = self.comm.gather_obj(result, root=self.root)
                if gathered is None:
                    continue
                last_round_empty = all(r is None for r in gathered)
                for rank, r in enumerate(gathered):
                    if isinstance(r, _Failed):
                        failures.append((rank, r.text))
                    elif r is not None:
                        results.append(r)
            status = self.comm.bcast_obj(failures or last_round_empty, root=self.root)
            if isinstance(status, list):
                if error is not None:
                    raise error
                raise RuntimeError("GenericMultiNodeEvaluator: calc_local failed on "
                                   + "; ".join(f"rank {r}: {text}" for r, text in status))
            if status:
                return results
