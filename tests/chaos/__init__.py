"""Chaos: transfers between accounts while the stack's components are killed, frozen and
restarted one at a time; then every store is compared with PostgreSQL by readers of the
harness's own (never the code under test).

    load.py     the bank: accounts, transfers, the load that moves money between them
    stack.py    a stack of the harness's own (`cdc up` on free ports), the apply job
    faults.py   the faults and the recovery a user would make after each
    readers.py  PostgreSQL, Redis, OpenSearch, Delta (a Spark session of its own), the DLQ
    compare.py  store against source, the balance invariant, the history's rules
    run.py      one chaos run and its figures (`python -m tests.chaos.run --help`)
"""
