"""The render queue's rules: schedule rows, ranking, leases, result plans, target writes, status."""
