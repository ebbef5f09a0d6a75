"""No tests: the server's are in tests/test_server_*.py, their kit in
tests/serverkit.py.  tests/test_search.py and tests/test_search_disk.py
still import the kit from here; once they import it from serverkit, this
file goes."""

from serverkit import TIMEOUT, Backend, _open, _start_item, _status, backend

__all__ = ["TIMEOUT", "Backend", "_open", "_start_item", "_status", "backend"]
