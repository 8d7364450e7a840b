"""PostgreSQL's types, each type's knowledge in one room: a value as Debezium encodes it,
decoded (decode) and computed by PostgreSQL (debezium_sql), back to PostgreSQL's text
(postgres_text), typed for Spark (spark_types) and Arrow (arrow_types), a key in one
form (keys), and the form each store holds it in (store_forms). Imports core only."""
