"""A short process's JIT directives: C2 skips start-up and planning code only.

The directives file is read by the JVM itself; its patterns are checked here with a
matcher of HotSpot's rules (a class pattern may start or end with ``*``; the first
directive that matches a method wins), against classes known to run per record and
classes known to run only while a query starts."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from jobs.streaming import jvm

# Classes whose methods run for every record of some pipeline: C2 must keep them.
PER_RECORD = [
    "org/apache/kafka/clients/consumer/internals/CompletedFetch",
    "org/apache/kafka/common/record/DefaultRecordBatch",
    "com/fasterxml/jackson/core/json/UTF8StreamJsonParser",
    "org/apache/spark/sql/catalyst/json/JacksonParser",
    "org/apache/spark/sql/catalyst/expressions/GeneratedClass$GeneratedIteratorForCodegenStage1",
    "org/apache/spark/sql/catalyst/expressions/UnsafeRow",
    "org/apache/spark/unsafe/types/UTF8String",
    "org/apache/spark/sql/execution/streaming/state/RocksDBStateStoreProvider",
    "org/apache/spark/sql/execution/datasources/parquet/VectorizedParquetRecordReader",
    "org/apache/spark/sql/delta/deletionvectors/RoaringBitmapArray",
    "org/apache/parquet/column/impl/ColumnReaderImpl",
    "org/apache/arrow/vector/BaseVariableWidthVector",
    "sun/security/ssl/SSLEngineImpl",
    "com/sun/crypto/provider/GaloisCounterMode",
    "java/util/HashMap",
    "java/lang/String",
    "java/util/regex/Pattern",
    "scala/collection/Iterator",
    "scala/reflect/ClassTag",
    "java/lang/invoke/LambdaForm$MH/0x0000000801234000",
    "java/lang/invoke/LambdaForm$DMH/0x0000000801234400",
]
# Classes that run while a query starts or is planned: C2 leaves them to C1.
START_UP = [
    "org/antlr/v4/runtime/atn/ParserATNSimulator",
    "org/apache/spark/sql/catalyst/parser/AstBuilder",
    "org/apache/spark/sql/catalyst/analysis/Analyzer",
    "org/apache/spark/sql/catalyst/optimizer/Optimizer",
    "org/apache/spark/sql/catalyst/trees/TreeNode",
    "org/codehaus/janino/UnitCompiler",
    "org/apache/xbean/asm9/ClassReader",
    "java/lang/invoke/InnerClassLambdaMetafactory",
    "java/io/ObjectInputStream",
    "jdk/internal/loader/URLClassPath$JarLoader",
    "py4j/commands/CallCommand",
]


def directives() -> list[dict[str, object]]:
    found = json.loads(jvm.JIT_DIRECTIVES.read_text())
    assert isinstance(found, list)
    return found


def class_matches(pattern: str, name: str) -> bool:
    klass = pattern.rsplit(".", 1)[0]
    if klass.startswith("*") and klass.endswith("*"):
        return klass.strip("*") in name
    if klass.endswith("*"):
        return name.startswith(klass[:-1])
    if klass.startswith("*"):
        return name.endswith(klass[1:])
    return name == klass


def c2_excluded(name: str) -> bool:
    for directive in directives():
        patterns = directive["match"]
        assert isinstance(patterns, list)
        if any(class_matches(p, name) for p in patterns):
            c2 = directive["c2"]
            assert isinstance(c2, dict)
            return bool(c2["Exclude"])
    return False


@pytest.mark.parametrize("name", PER_RECORD)
def test_c2_keeps_code_that_runs_per_record(name: str) -> None:
    assert not c2_excluded(name)


@pytest.mark.parametrize("name", START_UP)
def test_c2_leaves_start_up_code_to_c1(name: str) -> None:
    assert c2_excluded(name)


def test_only_a_short_process_gets_the_directives() -> None:
    short = jvm.driver_java_options("short")
    assert f"-XX:CompilerDirectivesFile={jvm.JIT_DIRECTIVES}" in short
    assert short.index("-XX:+UnlockDiagnosticVMOptions") < short.index("CompilerDirectivesFile")
    assert "CompilerDirectivesFile" not in jvm.driver_java_options("long")
    assert "CompilerDirectivesFile" not in jvm.driver_java_options()  # the default: long


def test_the_jvm_reads_every_directive(tmp_path: Path) -> None:
    """A JVM that cannot parse the file does not start: the real one reads it, and
    says so on stderr: a command's stdout is its own (a report, JSON)."""
    options = shlex.split(jvm.jit_options("short"))
    java = str(jvm.java_home() / "bin" / "java")
    done = subprocess.run([java, *options, "-version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{len(directives())} compiler directives added" in done.stderr
    assert done.stdout == ""
    broken = tmp_path / "broken.json"
    broken.write_text(jvm.JIT_DIRECTIVES.read_text().replace("[", "(", 1))
    refused = subprocess.run(
        [java, "-XX:+UnlockDiagnosticVMOptions", f"-XX:CompilerDirectivesFile={broken}"]
        + ["-version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0


@pytest.mark.parametrize(("asked", "expected"), [({}, "short"), ({"lifetime": "long"}, "long")])
def test_a_command_session_starts_spark_for_its_lifetime(
    asked: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command ends by itself unless it says otherwise (a continuous run)."""
    from jobs.settings import load_settings
    from jobs.streaming import spark

    started: list[str] = []

    class Session:
        def stop(self) -> None:
            pass

    def get_spark(*args: object) -> Session:
        started.append(str(args[4]))
        return Session()

    from pyspark import SparkContext

    # The suite's worker may hold a shared session: this command is a process's own.
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setattr(spark, "_host", None)
    monkeypatch.setattr(spark, "get_spark", get_spark)
    with spark.command_session(load_settings(), "probe", **asked):  # type: ignore[arg-type]
        pass
    assert started == [expected]
