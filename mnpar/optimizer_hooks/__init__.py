"""Optimizer hooks for models split over ranks: ``GradientClipping`` by the whole model's norm.

Importing this package (``import mnpar`` does) also makes chainer's own
``GradientClipping`` warn once where its optimizer's model holds a piece of a
split model (``ClippingWarning``).
"""
from ._gradient_clipping import ClippingWarning, GradientClipping, warn_on_pieces

__all__ = ["GradientClipping", "ClippingWarning"]

warn_on_pieces()
