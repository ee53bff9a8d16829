"""strata ring: pipeline-parallel inference across processes and machines on torch.distributed.

plan/: which members hold which layers (the partition search, its costs and timings, the
members and the links between them). runtime/: a stage's data plane (one node's layers with
its own KV cache, the transport, the driver and the stage loop, a loopback ring).
control/: the daemons (the wire protocol, discovery, the node, the leader and the member
side of a run, the layer timer, `fleet bench`). control imports plan and runtime; plan and
runtime import neither each other nor control (tests/test_ring_layering.py).
"""
