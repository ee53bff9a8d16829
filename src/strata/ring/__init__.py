"""strata ring: pipeline-parallel inference across processes and machines on torch.distributed.

Data plane: stage.py (one node's contiguous layers with its own KV cache), transport.py (process
groups per membership epoch, framed activations, PeerLost), pipeline.py (the driver on rank 0
and the stage loop on the others, replay after a lost peer). Control plane: plan, members,
discovery and the `strata ring` daemon.
"""
