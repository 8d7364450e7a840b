"""The search index: OpenSearch, one document per row (store.py: SearchStore)."""
