"""A Spark standalone cluster on 127.0.0.1 (one master, one worker) from the launcher pyspark ships
(`bin/spark-class`): a real distributed engine for tests, no download needed.

    with StandaloneCluster(work_dir) as cluster:
        cluster.master_url    # spark://127.0.0.1:<port>
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from devtools.ports import free_port
from devtools.spark import spark_home


class StandaloneCluster:
    def __init__(self, work_dir: Path, cores: int = 1, memory: str = "1g") -> None:
        self.work_dir, self.cores, self.memory = work_dir, cores, memory
        self.port, self.webui_port, self.worker_webui_port = free_port(), free_port(), free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.work_dir / "logs"),
        }

    def _start(self, name: str, *args: str) -> None:
        log = (self.work_dir / f"{name}.log").open("ab")
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        self.processes.append(
            subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        )

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as response:
            return json.load(response)

    def start(self, timeout: float = 120) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
        )
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--webui-port",
            str(self.worker_webui_port),
            "--work-dir",
            str(self.work_dir / "work"),
            self.master_url,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if any(w.get("state") == "ALIVE" for w in self.state().get("workers", [])):
                    return self
            except (OSError, ValueError):
                # Not up yet: refused, or (seen on a loaded machine) the UI answers /json/ with its
                # HTML page before the JSON handler is attached.
                pass
            if any(p.poll() is not None for p in self.processes):
                break
            time.sleep(0.5)
        self.stop()
        logs = "\n".join((self.work_dir / f"{n}.log").read_text(errors="replace")[-2000:] for n in ("master", "worker"))
        raise RuntimeError(f"the standalone cluster did not come up:\n{logs}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.processes = []

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        self.stop()
