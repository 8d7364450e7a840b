"""Reading the stores back: `cdc verify` (verify: the consistent cut and the row
comparison; quality: the warehouse's expectations; view_checks: each derived view
against its source or its log; reconcile: the one report), and mending them (repair,
rebuild), `cdc query`, and `cdc status` of a pipeline (status). Imports log, stores
and views, never apply."""
