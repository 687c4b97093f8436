"""`python -m airflow_plugin` is the `savepoints` command line."""

import sys

from .cli import main

sys.exit(main())
