"""The job runtime: runs a streaming query inside the Spark driver under management (docs/delivery.md,
docs/writing-a-job.md). An application file is just:

    from spark_jobs.runtime import SinkKind, SourceKind, StreamingJob, run

    def build(spark, job_args):          # build the query, do not start it
        ...
        return StreamingJob(df.writeStream.format("json").option("path", out), SinkKind.FILE, SourceKind.FILE)

    if __name__ == "__main__":
        run(build)

Modules, one job each: args (command line), delivery (guarantees -> settings), status (status.json:
board, listener, heartbeat), control (control channel, stop at a batch boundary), failure (error class),
sink (the sink guard before a query starts), seed (a start at given positions), initial (a transformWithState's
initial state), migration (a migration run), runner (the lifecycle), script (an ordinary script run as it is, its
query taken over when it starts: docs/writing-a-job.md), broker (the Kafka broker the engine hands the driver).
"""

from .args import RuntimeArgs, Trigger, parse_args, parse_trigger
from .broker import kafka_bootstrap_servers
from .delivery import Delivery, DeliveryRefused, SinkKind, SourceKind, StreamingJob
from .initial import InitialState, initial_state
from .runner import EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED, EXIT_USAGE, Build, Runner, main, run

__all__ = [
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "Build",
    "Delivery",
    "DeliveryRefused",
    "InitialState",
    "Runner",
    "RuntimeArgs",
    "SinkKind",
    "SourceKind",
    "StreamingJob",
    "Trigger",
    "initial_state",
    "kafka_bootstrap_servers",
    "main",
    "parse_args",
    "parse_trigger",
    "run",
]
