"""Links for model parallelism: MultiNodeChainList and MultiNodeNStepRNN."""
from ._chain_list import MultiNodeChainList
from ._n_step_rnn import MultiNodeNStepRNN, create_multi_node_n_step_rnn

__all__ = ["MultiNodeChainList", "MultiNodeNStepRNN", "create_multi_node_n_step_rnn"]
