"""More than one GPU: tensor- and expert-parallel decode on ``torch.distributed`` (chapter 10).

``dist`` starts a group of ranks (processes) and runs a function in each; ``tp`` shards the decoder of
the decoder of ``lib.models`` across ranks by heads and MLP columns; ``ep`` spreads a mixture-of-experts layer's experts
across ranks, with all-to-all dispatch and combine. NCCL on GPUs, gloo on the CPU.

Chapter: 10.
"""
