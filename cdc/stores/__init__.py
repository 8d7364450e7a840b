"""One module per store; each implements the Store interface of cdc.stores.base."""
