"""Links: MultiNodeChainList and MultiNodeNStepRNN for model parallelism;
MultiNodeBatchNormalization and create_mnbn_model for data parallelism."""
from ._batch_normalization import MultiNodeBatchNormalization
from ._chain_list import MultiNodeChainList
from ._create_mnbn_model import create_mnbn_model
from ._n_step_rnn import MultiNodeNStepRNN, create_multi_node_n_step_rnn

__all__ = ["MultiNodeChainList", "MultiNodeNStepRNN", "create_multi_node_n_step_rnn",
           "MultiNodeBatchNormalization", "create_mnbn_model"]
