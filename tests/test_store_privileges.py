"""A resume on PostgreSQL under a role without every privilege the search's writes need is refused up
front, in one line naming what is missing; with exactly those privileges it runs (so the list is whole)."""
from __future__ import annotations

import contextlib
import os
import time
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from conjugate.search.store import search_privileges
from test_search import cli, env, search_cli  # noqa: F401  (env: the fast evaluator profile fixture)
from test_store import PG_ENV, _fresh_postgres_database

BUDGET = 3


def _grant(conn, role: str, skip: tuple[str, str] | None = None) -> None:
    """`role` holds exactly what the check asks for (search_privileges, and the id sequences of the
    tables it inserts into), but `skip`."""
    conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA public TO "{role}"')
    for privilege, table in search_privileges():
        if (privilege, table) != skip:
            conn.exec_driver_sql(f'GRANT {privilege} ON {table} TO "{role}"')
        if privilege == "INSERT":
            sequence = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar()
            conn.exec_driver_sql(f'GRANT USAGE ON SEQUENCE {sequence} TO "{role}"')


def _counts(conn) -> tuple:
    return tuple(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in ("nodes", "evaluations")) + (
        conn.execute(text("SELECT updated_at FROM runs")).scalar(),)


def _connections(conn, role: str) -> int:
    """The role's server processes still connected, once a closed connection's process has ended."""
    for _ in range(50):
        left = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE usename = :r"), {"r": role}).scalar()
        if not left:
            return 0
        time.sleep(0.1)
    return left


def test_a_resume_needs_every_write_of_the_search(env):  # noqa: F811
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL store tests need ${PG_ENV} (bash .ci/postgres starts a server and prints one)")
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.execute(text("SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user")).scalar():
            pytest.fail("the test role cannot create roles: run `bash .ci/postgres` again (it grants CREATEROLE)")
    databases = _fresh_postgres_database(base)
    url = next(databases)
    roles = []
    try:
        code, out, err = search_cli(url, env["profile"], BUDGET)
        assert code == 0, out + err
        owner = create_engine(url, isolation_level="AUTOCOMMIT")
        for skip in (("INSERT", "nodes"), ("DELETE", "evaluations"), ("SELECT", "lessons"), None):  # None: all
            role = f"conjugate_limited_{uuid.uuid4().hex[:8]}"
            roles.append(role)
            with admin.connect() as conn:
                conn.exec_driver_sql(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'limited'")
                conn.exec_driver_sql(f'GRANT "{role}" TO CURRENT_USER')  # its connections may be ended with the database
            with owner.connect() as conn:
                _grant(conn, role, skip)
                before = _counts(conn)
            limited = make_url(url).set(username=role, password="limited").render_as_string(hide_password=False)
            code, out, err = cli("search", "--resume", limited, "--budget", BUDGET + 2)
            with owner.connect() as conn:
                after = _counts(conn)
                assert _connections(conn, role) == 0  # the command closed its connections
            if skip is None:  # the privileges the list names: the search ran and recorded its work
                assert code == 0, out + err
                assert after[0] >= before[0] and after[1] > before[1] and after[2] > before[2]
            else:
                shown = make_url(limited).render_as_string(hide_password=True)
                assert code == 2 and err.strip().splitlines() == [
                    f"error: {shown}: this role lacks {skip[0]} on {skip[1]}: a search records its evaluations "
                    "there; grant them, or copy the store where they are held"], err
                assert "limited" not in err.replace(role, "")  # the password stays out of the message
                assert after == before  # nothing written, not even the run's status
        owner.dispose()
    finally:
        next(databases, None)  # drops the database, and the roles' grants in it
        with admin.connect() as conn:
            for role in roles:
                with contextlib.suppress(Exception):  # never mask the test's own failure
                    conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')
        admin.dispose()
