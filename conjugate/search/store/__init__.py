"""The search's persistent store: the database (store.py), its tables and snapshots (schema.py), and the
check of a stored run's rows before they are used (integrity.py)."""
from conjugate.search.store.schema import (SCHEMA_VERSION, EvaluationRecord, NodeRecord, NodeStatus, RunRecord,
                                           RunStatus)
from conjugate.search.store.store import Store, StoreError, owner_id, search_privileges

__all__ = ["SCHEMA_VERSION", "Store", "StoreError", "RunRecord", "NodeRecord", "EvaluationRecord", "RunStatus",
           "NodeStatus", "owner_id", "search_privileges"]
