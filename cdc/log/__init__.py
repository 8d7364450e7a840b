"""The change log as the apply job reads it: a Debezium record decoded, in Python, Spark
and Arrow (envelope), the write rule (position), generated columns computed
(generated_columns), and what each store has applied (progress; freshness: its
commit-to-visible histogram). Imports core, types and capture."""
