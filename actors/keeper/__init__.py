"""The QueueKeeper actor: the node's schedule rows in memory, their only writer."""
