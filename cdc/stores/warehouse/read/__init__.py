"""What is read back of the warehouse: its rows for the checks and queries
(readback.py) and a Delta table's log read without Spark (delta_log.py)."""
