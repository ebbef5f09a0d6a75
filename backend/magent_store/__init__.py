"""magent-store: the persistence backend for magent sessions.

The package is layered as a functional core and an imperative shell:
`ledger` (pure thread/turn/item state and event application), `store`
(every byte on disk), `server` (the EPC wire) and `cli` (the command line).
"""

__version__ = "0.1.0"
