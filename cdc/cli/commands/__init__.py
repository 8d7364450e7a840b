"""The commands of `cdc`, one module per family, each registering on the app of
cdc/cli/base.py: stack (up, down, status, config, demo), capture (setup, snapshot,
backfill, resync, tables, drop), apply (apply, metrics, rebuild), check (verify, query,
search, get, dlq). cdc/cli/app.py imports them all."""
