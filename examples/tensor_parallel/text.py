"""The text the example learns: Python's own reference manual, bundled with Python.

``pydoc_data.topics`` holds the language reference's topics as plain text
(the pages ``help("assert")`` shows), some 460,000 characters of English and
code in every Python installation: nothing to download. The model reads it
one character at a time; its vocabulary is the characters that occur (about
a hundred, a count no tensor degree divides evenly).
"""
import numpy as np


def corpus():
    """The text, and its characters as ids (``int32``), and the characters by id."""
    import pydoc_data.topics

    text = "".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return text, np.array([index[c] for c in text], np.int32), chars


def batch(ids, step, size, length, seed):
    """``size`` windows of ``length + 1`` characters at places drawn for ``step``: inputs
    ``(size, length)`` and, shifted by one, their labels ``(size * length,)``."""
    rng = np.random.RandomState([seed, step])
    starts = rng.randint(0, len(ids) - length - 1, size)
    windows = np.stack([ids[s:s + length + 1] for s in starts])
    return windows[:, :-1], windows[:, 1:].reshape(-1)
