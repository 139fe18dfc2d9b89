"""The NodeStore actor: the one writer of the node's replicated stores, and their replication."""
