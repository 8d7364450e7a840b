"""Reading the stores back: `cdc verify` (verify: the consistent cut and the row
comparison; quality: the warehouse's expectations; stream_check, enrichment_check: the
views computed again from the log; reconcile: the one report), and mending them
(repair, rebuild), and `cdc query`. Imports log and stores, never apply."""
