"""The warehouse's writes of a batch: its route (routes.py) and the route's own helpers
(`_`-modules, imported only here and by the warehouse's store.py and native.py)."""
