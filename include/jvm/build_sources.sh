#!/usr/bin/env bash
# The platform's own JVM classes (include/jvm/sources), compiled against the pyspark
# in use into one jar beside the resolved ones: build_sources.sh PYTHON OUT_JAR
set -euo pipefail
python=$1
out=$2
for tool in javac jar; do
  command -v "$tool" >/dev/null || {
    echo "error: $tool not found: install a Java 17+ JDK (Debian: apt-get install openjdk-17-jdk-headless)"
    exit 1
  }
done
version=$(javac -version 2>&1 | sed -E 's/^javac ([0-9]+).*/\1/')
if [ "${version:-0}" -lt 17 ] 2>/dev/null; then
  echo "error: javac $version is too old: install a Java 17+ JDK (Debian: apt-get install openjdk-17-jdk-headless)"
  exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
mapfile -t sources < <(find "$here/sources" -name '*.java' | sort)
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
# Delta's classes too (the table id of a version), resolved beside the output.
javac --release 17 -nowarn -cp "$jars/*:$(dirname "$out")/*" -d "$classes" "${sources[@]}"
mkdir -p "$(dirname "$out")"
jar --create --file "$out.tmp" -C "$classes" .
mv "$out.tmp" "$out"
