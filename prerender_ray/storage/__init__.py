"""Stores and their records: RocksDB, the replicated registry, versioned envelopes, page records."""
