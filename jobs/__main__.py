"""``python -m jobs ...`` and ``spark-submit jobs/__main__.py ...``."""

import sys
from pathlib import Path

if not __package__:  # run as a script by spark-submit: make ``jobs`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.cli import main

sys.exit(main())
