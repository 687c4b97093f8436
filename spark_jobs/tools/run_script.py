"""The driver of a script version (a jobs file's `script = "..."`): spark-submit runs this file, which runs the
script as it is under the runtime (spark_jobs/runtime/script.py). core/jobs/deploy.py puts it in place of an
application."""

from spark_jobs.runtime.script import run_script

if __name__ == "__main__":
    run_script()
