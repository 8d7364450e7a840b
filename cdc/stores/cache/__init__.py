"""The cache: Redis, one hash per row (store.py: CacheStore)."""
