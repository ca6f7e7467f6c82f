"""``python -m jobs ...`` and ``spark-submit jobs/__main__.py ...``."""

import logging
import os
import sys
from pathlib import Path

if not __package__:  # run as a script by spark-submit: make ``jobs`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.cli import main

code = main()
# Everything is committed and flushed by now. Native libraries (Arrow's and
# librdkafka's thread pools) can abort the interpreter's own shutdown ("terminate
# called without an active exception", seen once as exit -6 after a clean
# `error:` line), so the exit code is handed to the OS directly.
sys.stdout.flush()
sys.stderr.flush()
logging.shutdown()
os._exit(code)
