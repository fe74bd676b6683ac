"""Datasets for model parallelism."""
from ._empty import EmptyDataset, create_empty_dataset

__all__ = ["create_empty_dataset", "EmptyDataset"]
