"""A stage's data plane: its layers and KV cache, the transport, the driver and the stage loop."""
