"""One module per store; each implements the Store interface of materializers.stores.base."""
