"""A child process that ends itself once the process that started it is gone (killed with SIGKILL, say),
whatever the child is busy with: a daemon thread polls the parent's pid and exits the process."""
from __future__ import annotations

import os
import threading
import time

PARENT_PID = "CONJUGATE_PARENT_PID"  # set by the parent in the child's environment (parent_env)
POLL_S = 0.5
EXIT_STATUS = 3


def parent_env(env: dict[str, str]) -> dict[str, str]:
    """`env` naming this process as the parent a child started with it watches."""
    return {**env, PARENT_PID: str(os.getpid())}


def exit_with_parent(poll_s: float = POLL_S) -> None:
    """Watch the parent (PARENT_PID, else the parent at this call) from a daemon thread; once it is no
    longer this process's parent (the process was re-parented), exit at once with EXIT_STATUS. The
    thread needs only the interpreter lock between bytecodes, so it runs while the main thread
    compiles, times or waits on the GPU."""
    named = os.environ.get(PARENT_PID, "")
    parent = int(named) if named.isdigit() else os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(EXIT_STATUS)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
