"""The warehouse's tables published for other engines: Iceberg (iceberg.py)."""
