"""The commands people run, on top of everything else: the CLI, the demo, pipeline
operations (setup, status, drop), the metrics endpoint and the output. They import
downwards only; nothing imports them but the tests and the benchmarks."""
