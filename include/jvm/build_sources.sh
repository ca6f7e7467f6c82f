#!/usr/bin/env bash
# The platform's own JVM classes (include/jvm/sources), compiled against the pyspark
# in use into one jar beside the resolved ones: build_sources.sh PYTHON OUT_JAR
set -euo pipefail
python=$1
out=$2
command -v javac >/dev/null || {
  echo "error: javac not found: install a Java 17+ JDK (Debian: apt-get install openjdk-17-jdk-headless)"
  exit 1
}
here=$(cd "$(dirname "$0")" && pwd)
jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac --release 17 -nowarn -cp "$jars/*" -d "$classes" $(find "$here/sources" -name '*.java' | sort)
mkdir -p "$(dirname "$out")"
jar --create --file "$out.tmp" -C "$classes" .
mv "$out.tmp" "$out"
