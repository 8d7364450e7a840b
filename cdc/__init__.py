"""The library: settings, errors, clients, the catalog of captured tables, decoding and
the topics (the base); capture/, what makes the log; components/, stack.py and
process.py, the local stack. docs/layout.md has the floors."""
