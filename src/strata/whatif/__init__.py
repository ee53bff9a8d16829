"""What if I bought X: fit, support, speed and cost on catalogue devices this host is not.

`device`: a catalogue device as a host profile and a datasheet roofline; `published`: the
shipped measurements and the per-class fit of η and the per-token cost; `provenance`: where
each device's η comes from (this DB, published, prior); `predict`: t = bytes/(BW·η) + c;
`plan`: the whatif rows; `sweep`: memory size and bandwidth varied; `validate`: held-out
published measurements predicted.
"""
