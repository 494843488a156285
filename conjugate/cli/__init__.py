"""Every `conjugate ...` command, and nothing else: `main` parses and dispatches (main.py), one module
per command group, the argument types they share (arguments.py) and the consoles they print on."""
from conjugate.cli.console import out
from conjugate.cli.main import main

__all__ = ["main", "out"]
