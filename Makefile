# The two commands a new user runs: `make demo` (the main job) and `make test` (the tests).
# Both set everything up themselves: uv (from PyPI if missing), the locked dependencies, a Java check.

# uv's own binary, once uv-bootstrap installed it (not `python3 -m uv`: that wrapper exports
# UV_INTERNAL__PARENT_INTERPRETER, and every `uv pip` run under it would install into python3, not the active venv)
UV = $(or $(shell command -v uv 2>/dev/null),$(shell python3 -c 'import uv; print(uv.find_uv_bin())' 2>/dev/null),python3 -m uv)
export PYTHONUNBUFFERED := 1
# The locked pyspark brings its own Spark: a SPARK_HOME of the user's shell (another Spark) is not for these.
unexport SPARK_HOME

.PHONY: uv-bootstrap setup s3proxy seaweedfs browser prometheus demo tour demo-yarn airflow test lint format bench bench-runtime bench-delete bench-upgrade bench-s3 bench-history bench-scale bench-autoscale

uv-bootstrap:  # its own target: make expands a recipe before running it, so setup's lines see the installed uv
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install --quiet "uv==0.13.8"

setup: uv-bootstrap
	@$(UV) sync --all-extras --frozen --quiet
	@$(UV) run --frozen python -m devtools.java >/dev/null
	@bash devtools/install_debian.sh mvn maven "make setup resolves the JVM jars with it (devtools/jvm.py)"
	@$(UV) run --frozen python -m devtools.jvm  # the JVM jars (Kafka, S3A, Delta, mini Hadoop): Maven, once
	@$(UV) run --frozen python -c "from airflow_plugin.core.spark_app import fence_jar; fence_jar()"  # the drivers' fence, compiled once

demo: setup  # the core lifecycle in a few minutes: deploy, savepoint, retention, a blue/green upgrade, exactly-once
	$(UV) run --frozen python -m devtools.demo

tour: setup  # the whole lifecycle: also the aborted and rolled-back upgrades, replay, migration, the refusals
	$(UV) run --frozen python -m devtools.demo --tour

demo-yarn: setup  # the job on YARN in cluster mode, checkpoints on HDFS: Hadoop's mini cluster (devtools/yarn_demo.py)
	$(UV) run --frozen python -m devtools.yarn_demo

AIRFLOW_PORT ?= 8080
AIRFLOW_DIR ?= .airflow
airflow: setup  # the UI way: `airflow standalone` with the plugin and DAGs (http://127.0.0.1:$(AIRFLOW_PORT))
	$(UV) run --frozen python -m devtools.airflow_ui --port $(AIRFLOW_PORT) --home $(AIRFLOW_DIR)

s3proxy: uv-bootstrap  # the disk-backed S3 server (S3Proxy, a jar from Maven Central, once into ~/.m2): setup resolves it too
	@$(UV) run --frozen python -m devtools.jvm s3proxy

seaweedfs:  # SeaweedFS's weed, built once from its Go module into ~/.cache/spark-savepoints (10 minutes of 2 cores): make bench-scale's server
	@$(UV) run --frozen python -m devtools.disk_s3 --build

browser:  # Debian's chromium for the browser test (playwright drives the system browser; no download)
	@bash devtools/install_debian.sh /usr/bin/chromium chromium "the browser test drives it (tests/airflow/test_ui_browser.py)"

prometheus:  # Debian's prometheus: promtool checks and unit-tests the alert rules, a real Prometheus scrapes the plugin
	@bash devtools/install_debian.sh promtool prometheus "the alert rules' tests and the scrape test (tests/core/test_metrics.py, tests/e2e/test_make_airflow.py)"

test: setup browser prometheus lint
	$(UV) run --frozen pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=0 --durations-min=5  # a file per core, the longest first (tests/conftest.py); every test of 5 s or more: CI (.ci/run) has a budget of 50 minutes, 90 at most

lint:
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .

format:
	$(UV) run --frozen ruff check --fix .
	$(UV) run --frozen ruff format .

bench: setup  # the snapshot engine against its peers, then a savepoint of the Kafka job against aws s3 sync
	$(UV) run --frozen python -m bench.snapshot_bench
	$(UV) run --frozen python -m bench.kafka_bench

bench-runtime: setup
	$(UV) run --frozen python -m bench.runtime_bench

bench-delete: setup
	$(UV) run --frozen python -m bench.delete_bench

bench-upgrade: setup
	$(UV) run --frozen python -m bench.upgrade_bench

bench-s3: setup  # a snapshot of a checkpoint on S3 into a store on S3 against aws s3 sync s3 -> s3, client bytes counted
	$(UV) run --frozen python -m bench.s3_copy_bench

bench-scale: setup seaweedfs  # savepoints, restore, verify, an upgrade and retention at 5 GB of RocksDB state on SeaweedFS, against s5cmd and aws s3 sync
	$(UV) run --frozen python -m bench.scale_bench

bench-history: setup  # everyday commands at 10, 100 and 1,000 snapshots, 100 jobs, prune + gc of 10,000 snapshots
	$(UV) run --frozen python -m bench.history_bench

bench-autoscale: setup  # the autoscaler against the same Kafka job fixed at its starting and its max size: lag growing -> back at its floor
	$(UV) run --frozen python -m bench.autoscale_bench
