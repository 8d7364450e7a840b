"""The snapshot engine: the initial snapshot at the slot's consistent point (initial),
its rows as Debezium's events (encoding) and its progress (state)."""
