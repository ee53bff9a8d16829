"""The partition a ring would use: members, links, per-block costs and timings, the search."""
