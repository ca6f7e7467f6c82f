"""The package executors import: a zip of ``jobs`` that works with nothing else on
the path, and the executors' Python chosen by the setting or the master."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile

from jobs.streaming.spark import CLUSTER_PYTHON, executor_python, package_zip


def test_the_zip_alone_imports_what_executors_run() -> None:
    archive = package_zip()
    assert "jobs/__init__.py" in zipfile.ZipFile(archive).namelist()  # zipimport: no namespaces
    code = (
        # Executors read Kafka through Spark's JVM source: no Kafka client in Python.
        "import sys; sys.modules['confluent_kafka'] = None; sys.path.insert(0, sys.argv[1]); "
        "import jobs.streaming.seed, jobs.errors; "
        "import jobs.streaming.changelog_files; "
        "print(jobs.streaming.changelog_files.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(archive)],
        cwd=tempfile.gettempdir(),  # not the project: only the zip can provide ``jobs``
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(archive))


def test_the_zip_is_named_by_its_content() -> None:
    assert package_zip() == package_zip()
    assert package_zip().name.startswith("jobs-")


def test_executors_python() -> None:
    assert executor_python("local[2]", None) == sys.executable
    assert executor_python("spark://h:7077", None) == CLUSTER_PYTHON
    assert executor_python("spark://h:7077", "/opt/py/bin/python3") == "/opt/py/bin/python3"
    assert executor_python("local[*]", "/opt/py/bin/python3") == "/opt/py/bin/python3"
