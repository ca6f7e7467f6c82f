# Two commands a new user needs:
#   make demo   set up .venv, start the embedded broker, produce sample clicks,
#               run the user_clicks pipeline, print its state and ledger
#   make test   set up .venv, lint, type-check and run every test
#   make unit   lint, type-check and the tests that start no server (a few minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt constraints.txt | sha1sum | cut -c1-12)
# JVM jars (Spark's Kafka source, the embedded Apache Kafka broker), pinned in
# include/jvm/ and resolved once with mvn; nothing resolves at run time.
POMS := include/jvm/pom.xml include/jvm/spark/pom.xml include/jvm/kafka/pom.xml include/jvm/kafka-tools/pom.xml
JARS := .jvm
JARS_STAMP := $(JARS)/.resolved-$(shell cat $(POMS) | sha1sum | cut -c1-12)
# The platform's own JVM classes (include/jvm/sources), compiled against pyspark's jars.
SOURCES := $(shell find include/jvm/sources -name '*.java') include/jvm/build_sources.sh
SOURCES_JAR := $(JARS)/spark/platform-sources.jar

.PHONY: setup demo test unit lint servers bench broker-stop clean airflow airflow-stop

# Bytecode for every installed module, written once here on both cores (pip's own
# pass is serial): a Python that may not write it (PYTHONDONTWRITEBYTECODE) would
# compile its imports in every process, each job, Airflow task and Spark worker
# (a job's imports 2.2 s -> 0.7 s, Airflow's 3.9 s -> 1.6 s; docs/benchmarks.md).
$(STAMP): requirements.txt constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null
	rm -f $(VENV)/.installed-* && touch $(STAMP)

$(JARS_STAMP): $(POMS)
	@command -v java >/dev/null || { echo "error: java not found: install a Java 17+ JDK (Debian: apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@command -v mvn >/dev/null || { echo "error: mvn not found: install Apache Maven 3.8+ (Debian: apt-get install maven)"; exit 1; }
	rm -rf $(JARS)/spark $(JARS)/kafka $(JARS)/kafka-tools
	mvn -q -B -f include/jvm/pom.xml -Djars.dir=$(CURDIR)/$(JARS) package
	rm -f $(JARS)/.resolved-* && touch $(JARS_STAMP)

$(SOURCES_JAR): $(SOURCES) $(JARS_STAMP) $(STAMP)
	include/jvm/build_sources.sh $(BIN)/python $@

setup: $(STAMP) $(JARS_STAMP) $(SOURCES_JAR)
	@$(BIN)/python -m compileall -q -j 0 jobs plugins include dags benchmarks tests >/dev/null

demo: setup
	$(BIN)/python -m jobs broker start
	$(BIN)/python -m include.sample_data clicks --count 50000 --bad 25
	$(BIN)/python -m jobs run --pipeline user_clicks
	@echo "The broker keeps running for 'python -m jobs status'; stop it with: make broker-stop"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# -rs: the run ends with the number of skipped tests and why (under CI, where
# CI is set, a skip fails: tests/conftest.py).
test:
	$(MAKE) -j2 lint servers
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder --durations=40

unit: lint
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n 2 -m "not integration"

# The servers the tests run from Debian: chromium for the browser test (Playwright's
# own download is offline), prometheus and prometheus-pushgateway for the metrics
# tests. One apt-get for all (apt holds one lock); ``make -j2 test`` installs them
# while pip and Maven set up the rest.
DEBIAN_SERVERS := chromium prometheus prometheus-pushgateway
servers:
	@missing=$$(for p in $(DEBIAN_SERVERS); do command -v $$p >/dev/null || printf "%s " $$p; done); \
	  [ -z "$$missing" ] || { echo "installing Debian's $${missing% } for the tests"; \
	  apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1; } \
	  || echo "WARNING: could not install $$missing: their tests will be skipped (a failure under CI)"; }

bench: setup
	$(BIN)/python -m benchmarks.throughput

broker-stop: setup
	$(BIN)/python -m jobs broker stop

clean:
	rm -rf warehouse .broker .jvm

airflow: setup
	$(BIN)/python -m include.local_airflow start

airflow-stop: setup
	$(BIN)/python -m include.local_airflow stop
