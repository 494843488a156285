"""Opening a search database by what a user names it: a SQLAlchemy URL or a SQLite file."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


@contextmanager
def open_store(target: str, create: bool = False):
    """The store at a URL or SQLite path, as a context. Without `create` nothing is made or written on
    opening (a missing file, an empty or foreign database is refused); a store error met inside the
    context (a damaged row, a missing one) names the database."""
    from conjugate.search.store import Store, StoreError

    store = Store.open(target, create=create)
    try:
        yield store
    except StoreError as e:
        if target in str(e) or store.url_for_display in str(e):
            raise
        raise StoreError(f"{target}: {e}") from e
    finally:
        store.close()


def database_file(target: str | None) -> str | None:
    """The SQLite file a database argument names (a plain path or a sqlite URL), None for a server."""
    if target is None or "://" not in target:
        return target and str(Path(target).expanduser())
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(target)
    except ArgumentError:
        return None  # refused where the store opens
    return url.database if url.get_backend_name() == "sqlite" and url.database not in ("", ":memory:") else None
