"""Reading the stores back: `cdc verify` (verify: the consistent cut and the row
comparison; quality: a store's expectations; view_checks: each derived view against its
source or its log; reconcile: the one report), and mending them (repair, rebuild, and
dead_letters: `cdc dlq`, the dead letters read back and replayed), `cdc query`, and
`cdc status` of a pipeline (status). The last floor of the flow: imports every floor
below it but the stack, and names no store (test_layers.py)."""
