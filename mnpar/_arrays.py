"""The "array or tuple of arrays" idea, in one place.

Messages, functions and links all accept either one array or a tuple/list of
arrays. ``as_array_list`` validates such data once and hands back a flat list
plus whether it was a tuple, so no caller repeats ``isinstance`` checks.
"""
import contextlib
from typing import Any, ContextManager, List, Optional, Sequence, Tuple

import numpy as np

try:  # cupy is optional: mnpar runs on CPUs with NumPy alone.
    import cupy as _cupy
except Exception:  # ImportError, or a broken CUDA install
    _cupy = None

SUPPORTED_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def cupy_module():
    """Returns the cupy module, or None where it is not installed."""
    return _cupy


def is_cupy_array(x: Any) -> bool:
    return _cupy is not None and isinstance(x, _cupy.ndarray)


def is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or is_cupy_array(x)


def get_array_module(x: Any):
    return _cupy if is_cupy_array(x) else np


PINNED_FROM = 256 << 10  # bytes from which a GPU array is staged in page-locked memory


def to_host(x: Any, pinned: Optional[bool] = None) -> np.ndarray:
    """``x`` as a NumPy array: ``x`` itself, or its copy from the GPU, done on return.

    The one way mnpar stages GPU arrays on the host (messages, collectives,
    halos, gathers, gradient reductions). From ``PINNED_FROM`` bytes (or with
    ``pinned``) the copy lands in page-locked memory from cupy's pinned pool:
    the GPU copies there by DMA at full speed, and the pool hands the same
    memory back call after call (docs/benchmarks_history.rst, "staging in
    pinned memory"); a small array costs less as a plain copy.
    """
    if not is_cupy_array(x):
        return x
    if pinned is None:
        pinned = x.nbytes >= PINNED_FROM
    if not pinned:
        return x.get()
    out = pinned_empty(x.shape, x.dtype)
    if x.size:
        _cupy.ascontiguousarray(x).get(out=out)  # blocking: done on return
    return out


def pinned_empty(shape, dtype) -> np.ndarray:
    """A host array in page-locked memory from cupy's pinned pool (cupy must be there).

    The GPU copies to and from such memory by DMA, at full speed, and the pool
    hands the same memory back message after message; a fresh pageable array
    per message costs the driver's staging copy and page faults on top.
    """
    import cupyx

    return cupyx.empty_pinned(shape, dtype)


def sync_device(x: Any) -> None:
    """Waits until ``x``'s GPU has run the work queued on it; nothing for NumPy arrays.

    Needed before MPI reads GPU memory itself (``cuda_aware``): MPI does not
    wait for the kernels that are still writing it.
    """
    if is_cupy_array(x):
        x.device.synchronize()


def device_of(x: Any) -> ContextManager:
    """A context in which ``x``'s GPU is current (nothing to do for NumPy arrays)."""
    return x.device if is_cupy_array(x) else contextlib.nullcontext()


def check_dtype(dtype: np.dtype, what: str) -> None:
    if dtype.kind not in SUPPORTED_KINDS:
        raise TypeError(f"{what} has dtype {dtype}, which mnpar cannot send; "
                        "use a numeric or bool dtype")


def as_array_list(data: Any, what: str = "data") -> Tuple[List[Any], bool]:
    """Validates an array or a tuple/list of arrays.

    Returns:
        ``(arrays, is_tuple)``: the arrays as a list, and whether ``data`` was
        a tuple or list.

    Raises:
        TypeError: ``data`` is neither, its arrays mix NumPy and cupy, or one
            has a dtype that cannot travel (object, strings).
    """
    if is_array(data):
        check_dtype(data.dtype, what)
        return [data], False
    if not isinstance(data, (tuple, list)):
        raise TypeError(f"{what} must be an array or a tuple/list of arrays, "
                        f"not {type(data).__name__}")
    arrays = list(data)
    for i, x in enumerate(arrays):
        if not is_array(x):
            raise TypeError(f"{what}[{i}] must be an array, not {type(x).__name__}")
        check_dtype(x.dtype, f"{what}[{i}]")
    if arrays and len({is_cupy_array(x) for x in arrays}) > 1:
        raise TypeError(f"{what} mixes NumPy and cupy arrays in one message; "
                        "move them to one device first")
    return arrays, True


def as_tuple(x: Any) -> Tuple[Any, ...]:
    """``x`` itself if it is a tuple, a list as a tuple, else ``(x,)``."""
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def unwrap(xs: Sequence[Any], is_tuple: bool) -> Any:
    """The inverse of ``as_array_list``: a tuple, or the single item."""
    return tuple(xs) if is_tuple else xs[0]
