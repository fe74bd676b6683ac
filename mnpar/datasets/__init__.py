"""Datasets for model parallelism, and scattering a dataset for data parallelism."""
from .._errors import DataSizeError
from ._empty import EmptyDataset, create_empty_dataset
from ._scatter import scatter_dataset, scatter_index

__all__ = ["create_empty_dataset", "EmptyDataset", "scatter_dataset", "scatter_index",
           "DataSizeError"]
