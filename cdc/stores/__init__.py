"""One package per store (cache, search, warehouse), each declaring itself (its
DECLARATION); base: what a store is (StoreWriter, StoreReader, the interfaces of its
abilities, the derived views as the apply job and the checks see them); registry: a
store made by name, or found by what it can do."""
