"""`python -m shardinfer ...` is the `shardinfer` command."""

import sys

from shardinfer.jobs.cli import main

sys.exit(main())
