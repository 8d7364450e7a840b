"""The ground floor: settings, errors, what is said to a person (say), files and state
folders, table filters, the config file, clients of Kafka, Redis and OpenSearch, the
Spark session, the catalog of captured tables and their identity across renames, and
the topics. Imports nothing else of cdc."""
