"""The commands people run, on top of everything else: the CLI (`cdc`: app, base, and
commands/, one module per family), the demo and
its workload, the metrics endpoint and the output. They import downwards only; nothing
imports them but the tests and the benchmarks."""
