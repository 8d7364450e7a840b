"""The snapshot engine: the initial snapshot at the slot's consistent point (initial)
and its rows as Debezium's events (encoding). Its record per pipeline is
cdc/capture/snapshots.py."""
