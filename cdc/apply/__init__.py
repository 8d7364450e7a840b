"""The apply job: its streaming queries and their restarts (job), a store's side of each
micro-batch in named steps (batch: store-agnostic; a frame store writes its batch by
its own route, FrameStore.write_batch), the position guard each batch passes first
(guards), the row stores' rows of a batch (row_batches), dead letters (dead_letters),
and a store in a process of its own (own_process, own_process_main). It names no store: each
is found through the registry, by what it can do (its declaration's abilities), and so
are the derived views (the views door of the store that keeps them). Imports log,
stores and capture (each batch reads the source side through one door,
capture/source_view.py); never check, which comes after it."""
