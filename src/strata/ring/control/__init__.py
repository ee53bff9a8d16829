"""The daemons: the wire protocol, discovery, the node, the leader and a member's side of a run."""
