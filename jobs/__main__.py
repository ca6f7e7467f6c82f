"""``python -m jobs ...`` and ``spark-submit jobs/__main__.py ...``."""

import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path

if not __package__:  # run as a script by spark-submit: make ``jobs`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.cli import main

# ``kill -USR1 <pid>`` prints every Python thread's stack to stderr (a run that
# seems stuck says where; ``jstack`` does the same for its JVM).
faulthandler.register(signal.SIGUSR1, all_threads=True)
code = main()
# Everything is committed and flushed by now. Native libraries (Arrow's and
# librdkafka's thread pools) can abort the interpreter's own shutdown ("terminate
# called without an active exception", seen once as exit -6 after a clean
# `error:` line), so the exit code is handed to the OS directly.
sys.stdout.flush()
sys.stderr.flush()
logging.shutdown()
os._exit(code)
