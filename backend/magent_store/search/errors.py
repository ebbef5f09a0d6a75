"""What a search or the index says when it cannot do as asked."""

from __future__ import annotations


class SearchError(Exception):
    """A search that cannot run as asked; the message says what to change."""


class QueryError(SearchError, ValueError):
    """A query that cannot be understood."""
