"""The bot path: middleware, the cache hit, the miss (peer rescue, render-now, origin), page reads, the
peer client, counters, and the replica's state and lifecycle."""
