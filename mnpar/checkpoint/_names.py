"""Global names: the same array has the same name whatever rank holds it.

A checkpoint names each parameter by its path in the *whole* model, so that
a model split one way saves what a model split another way loads. Where
every rank holds the whole model (plain or sharded data parallelism) a
link's own path is its global path. Where a rank holds pieces, ``names``
says what each local link is in the whole model:

==================================  ===========================================
``names``                           a local link's global path
==================================  ===========================================
None                                its own path
a ``chainer.Link`` (the whole       the path of the same link object there: for
model, built alike on every rank)   pieces made of the whole model's own links
                                    (``build_stage``, a MultiNodeChainList of
                                    its sublinks)
a dict ``{local prefix: global}``   the longest matching prefix replaced
a callable                          ``names(local_path)``
==================================  ===========================================
"""
from typing import Any, Callable, Dict

import chainer

from ._errors import CheckpointError


def join(link_path: str, attr: str) -> str:
    """``'/a/b' + 'W' -> '/a/b/W'``; ``'/' + 'W' -> '/W'``."""
    return f"{link_path.rstrip('/')}/{attr}"


def _prefixes(mapping: Dict[str, str]) -> Callable[[str], str]:
    items = sorted(((k.rstrip("/") or "/", v.rstrip("/")) for k, v in mapping.items()),
                   key=lambda kv: -len(kv[0]))

    def rename(path: str) -> str:
        for local, whole in items:
            if local == "/" or path == local or path.startswith(local + "/"):
                rest = path if local == "/" else path[len(local):]
                return (whole + rest).replace("//", "/") or "/"
        return path
    return rename


def global_paths(model: chainer.Link, names: Any) -> Dict[int, str]:
    """id of every link of ``model`` that holds parameters or persistent values -> its
    global path; ``CheckpointError`` where ``names`` does not place one."""
    local = list(model.namedlinks())
    if names is None:
        return {id(link): path for path, link in local}
    if isinstance(names, chainer.Link):
        whole = {id(link): path for path, link in names.namedlinks()}
        out = {}
        for path, link in local:
            if id(link) in whole:
                out[id(link)] = whole[id(link)]
            elif link._params or link._persistent:
                raise CheckpointError(
                    f"names: the link {path!r} ({type(link).__name__}) of this rank's model is "
                    "not a link of the whole model given as names; build the pieces from the "
                    "whole model's own links, or give names as a dict of path prefixes")
        return out
    if isinstance(names, dict):
        rename = _prefixes(names)
    elif callable(names):
        rename = names
    else:
        raise TypeError(f"names must be None, the whole chainer.Link, a dict of path prefixes "
                        f"or a callable, not {type(names).__name__}")
    return {id(link): rename(path) for path, link in local}


def parameter_names(model: chainer.Link, names: Any) -> Dict[str, str]:
    """Local path of every parameter of ``model`` -> its global path; ``CheckpointError``
    if two local parameters get one global name."""
    paths = global_paths(model, names)
    out: Dict[str, str] = {}
    seen: Dict[str, str] = {}
    for path, link in model.namedlinks():
        if id(link) not in paths:
            continue
        for attr in sorted(link._params):
            g = join(paths[id(link)], attr)
            mine = join(path, attr)
            if g in seen:
                raise CheckpointError(f"names: the parameters {seen[g]!r} and {mine!r} of this "
                                      f"rank's model both get the global name {g!r}")
            seen[g] = mine
            out[mine] = g
    return out
