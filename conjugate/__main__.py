import sys

from conjugate.cli import main

sys.exit(main())
