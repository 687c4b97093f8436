"""The savepoints page in Airflow's UI: a FastAPI app (app.py) that the plugin mounts under /savepoints,
its access rules (security.py), what it shows (views.py), the savepoint DAG's runs (runs.py) and the
static page itself (static/)."""
