"""Messages out of place in ``send``/``recv``: refused on both ranks, with the fix.

Every gradient that ``recv``'s backward sends back carries a flag in its
header (``_message.GRADIENT``), so both kinds of mistake are seen by the
rank that receives the message out of place, with no message and no wait
added to a correct run::

    rank 0 forgets a delegate            rank 0                  rank 1
    (step 2: the gradient of step 1's    send h ──────────────>  recv h
    send is still queued)                recv y  <── gradient ──  (step 1's, never
                                           = flagged: refused      received)

    two sends without pseudo_connect     send a, send b ───────>  recv a, recv b
    (step 1 took b's gradient; a's is    backward of b  <── ga ──  (step 1's)
    left, and step 2's b takes it)         = a's shape: refused

``send``'s backward also checks the shapes and dtypes against the arrays it
sent. The rank that finds the mistake raises ``MessageMismatchError`` and
sends its peer a report (``Communicator.report``), which the peer's next
receive from it on that tag raises, so neither rank goes on with a wrong
array. Not caught: a gradient of the same shape and dtype taken by the
wrong send (two sends of equal arrays without ``pseudo_connect``), and
messages above 64 KiB, where the ranks' waits for each other's large sends
come first (the timeout then says who waited for whom).
"""
from typing import Any, List, Sequence

from .._errors import MessageMismatchError
from ..communicators._facade import Communicator

FIX = ("Every send's delegate variable must reach the backward pass: pass it to the next "
       "recv (phi = send(h, comm, rank); y = recv(comm, rank, delegate_variable=phi)), join "
       "it to what follows with pseudo_connect(phi, y) when a send follows a send, or "
       "return it as the model's output (docs/tutorial.rst, 'send, recv and delegate "
       "variables'); a MultiNodeChainList does this for you")


def arrays_text(shapes: Sequence[Any], dtypes: Sequence[Any]) -> str:
    """``(2, 3) float32, (4,) int32``: one array's shape and dtype after another."""
    return ", ".join(f"{tuple(s)} {d}" for s, d in zip(shapes, dtypes)) or "no arrays"


def refuse(comm: Communicator, peer: int, tag: int, text: str) -> MessageMismatchError:
    """Reports ``text`` to ``peer`` and returns the error to raise here."""
    comm.report(text, peer, tag)
    return MessageMismatchError(text)


def gradient_in_forward(comm: Communicator, peer: int, tag: int,
                        arrays: List[Any]) -> MessageMismatchError:
    """``recv``'s forward received a gradient that ``peer`` sent back."""
    rank = comm.rank
    got = arrays_text([a.shape for a in arrays], [a.dtype for a in arrays])
    return refuse(comm, peer, tag, (
        f"rank {rank}: functions.recv from rank {peer} (tag {tag}) expected the arrays rank "
        f"{peer} sends forward, but received a gradient ({got}) that rank {peer} sent back "
        f"in its backward pass for an earlier functions.send from rank {rank} to rank {peer}, "
        f"whose backward never ran on rank {rank}: that send's delegate variable did not "
        f"reach rank {rank}'s backward pass (a recv after a send without "
        f"delegate_variable?). {FIX}"))


def wrong_gradient(comm: Communicator, peer: int, tag: int, shapes: Sequence[Any],
                   dtypes: Sequence[Any], grads: List[Any],
                   is_gradient: bool) -> MessageMismatchError:
    """``send``'s backward received something other than the gradient of its arrays."""
    rank = comm.rank
    sent = arrays_text(shapes, dtypes)
    got = arrays_text([() if g is None else g.shape for g in grads],
                      ["absent" if g is None else g.dtype for g in grads])
    if is_gradient:
        why = (f"but the gradient rank {peer} sent back is {got}: the gradient of another "
               f"message. A send on rank {rank} whose delegate variable did not reach the "
               "backward pass (two sends in a row without pseudo_connect?) left its "
               "gradient unreceived, and this backward took it")
    else:
        why = (f"but received {got}, which rank {peer} sent forward, not as a gradient: "
               f"rank {peer}'s sends and receives run out of step with rank {rank}'s")
    return refuse(comm, peer, tag, (
        f"rank {rank}: functions.send to rank {peer} (tag {tag}) sent {sent} forward and "
        f"waited in its backward pass for their gradient, {why}. {FIX}"))
