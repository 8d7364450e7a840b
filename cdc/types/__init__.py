"""PostgreSQL's types: a value as Debezium encodes it decoded (decode), back to
PostgreSQL's text (postgres_text), typed for Spark (spark_types), and a key in one form
(keys). Imports core only."""
