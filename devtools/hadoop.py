"""HDFS and YARN on 127.0.0.1 for tests and the demo: Hadoop's mini cluster (a NameNode, a DataNode, a
ResourceManager and a NodeManager) in one JVM.

with MiniHadoop() as hadoop:                   # a fresh cluster in a temporary directory, free ports
    hadoop.hdfs_uri                            # "hdfs://127.0.0.1:<port>": checkpoint roots, spark.yarn.stagingDir
    hadoop.conf_dir                            # the client configuration: HADOOP_CONF_DIR for spark-submit
    hadoop.env()                               # {"HADOOP_CONF_DIR": ...}: what a YARN submission needs
    hadoop.application("application_..._0001")  # the ResourceManager's record of an application (REST API)

The jars come from devtools/jvm.py (group hadoop-minicluster), the launcher is devtools/jvm/MiniHadoop.java (run by
Java's source-file launcher: a JDK is needed, `make setup`'s Java check says which), Java from devtools/java.py. The
NodeManager runs containers as processes of its own (YARN's DefaultContainerExecutor), so a Spark driver in cluster
mode is a child of this JVM, never of spark-submit. Containers are small (see _config) and the NodeManager offers
6 GiB of memory in all: two applications of a driver and two executors fit at once. The log goes to
<tmp>/hadoop.log; a cluster that does not come up raises with the log's tail. stop() (and leaving the `with`, also
on Ctrl-C) closes the JVM's standard input, which stops YARN (and the containers it runs), then HDFS; SIGTERM, then
SIGKILL after STOP_TIMEOUT_SECONDS if it does not end, and then any container process still running in the
cluster's directory. A Python that dies closes that input too.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from devtools import java, jvm
from devtools.jvm_service import JvmService
from devtools.ports import free_ports

START_TIMEOUT_SECONDS = 240.0  # four servers in one JVM on 2 busy cores (about 10 s when idle)
STOP_TIMEOUT_SECONDS = 60.0  # a stop takes a few seconds (MiniHadoop.java bounds YARN's)
LAUNCHER = Path(__file__).resolve().parent / "jvm" / "MiniHadoop.java"
NODE_MEMORY_MB = 6144  # what the NodeManager offers: two applications of a driver and two executors (896 MB each)
LOOPBACK = "127.0.0.1"

_LOG = logging.getLogger(__name__)

_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
# what happens to applications and containers: enough to follow a test without the servers' chatter
logger.apps.name = org.apache.hadoop.yarn.server.resourcemanager.RMAuditLogger
logger.apps.level = info
logger.containers.name = org.apache.hadoop.yarn.server.nodemanager.containermanager.container.ContainerImpl
logger.containers.level = info
"""

# Java 17 closes the JDK's internals that YARN's web apps (Guice) and Hadoop's RPC reach into; Hadoop's own
# scripts open the same for Java 17
_OPENED = ("java.lang", "java.lang.reflect", "java.util", "java.util.concurrent", "java.io", "java.net", "java.nio")
_ADD_OPENS = [f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in (*_OPENED, "sun.nio.ch")]


class HadoopError(RuntimeError):
    """The mini cluster failed to start, or a request to it failed."""


def java_home() -> Path:
    """The JDK that runs the cluster; the NodeManager starts containers with `$JAVA_HOME/bin/java`."""
    executable = java.java_executable()
    if executable is None:
        raise HadoopError(f"the mini Hadoop cluster needs Java: {java.java_problem()}")
    home = Path(executable).resolve().parent.parent
    if not (home / "bin" / "javac").exists():
        raise HadoopError(
            f"the mini Hadoop cluster's launcher ({LAUNCHER.name}) is a Java source file, which `java` runs only "
            f"from a JDK, and {home} has no javac: install a JDK (Debian/Ubuntu: `apt-get install -y "
            "openjdk-17-jdk-headless`) or point JAVA_HOME at one"
        )
    return home


class MiniHadoop(JvmService):
    what = "the mini Hadoop cluster"
    error = HadoopError
    dir_prefix = "mini-hadoop-"
    log_name = "hadoop.log"
    stop_timeout = STOP_TIMEOUT_SECONDS

    def __init__(self, start_timeout: float = START_TIMEOUT_SECONDS) -> None:
        super().__init__(start_timeout)
        self.ports: dict[str, int] = {}

    # --- lifecycle ---

    def _java_command(self) -> list[str]:
        problem = java.java_problem()
        if problem:
            raise HadoopError(f"the mini Hadoop cluster needs Java: {problem}")
        return [
            str(java_home() / "bin" / "java"),
            "-Xmx768m",
            "-XX:TieredStopAtLevel=1",  # C1 only: a test cluster starts faster and needs no peak speed
            *_ADD_OPENS,
            "-cp",
            os.pathsep.join(str(jar) for jar in jvm.classpath("hadoop-minicluster")),
        ]

    def _launch(self, command: list[str]) -> bool:
        """Starts the cluster on new ports; False when another process took one of them first."""
        directory = self._started_dir
        work = directory / "cluster"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        names = ("namenode", "namenode_http", "rm", "rm_scheduler", "rm_tracker", "rm_admin", "rm_web")
        self.ports = dict(zip([*names, "nm", "nm_localizer", "nm_web"], free_ports(len(names) + 3), strict=True))
        settings = directory / "settings.properties"
        settings.write_text("".join(f"{k}={v}\n" for k, v in self._config(work).items()))
        (directory / "log4j2.properties").write_text(_LOG4J2)
        ready = directory / "ready"
        ready.unlink(missing_ok=True)
        log_config = f"-Dlog4j2.configurationFile={directory / 'log4j2.properties'}"
        self._spawn(
            [*command, log_config, str(LAUNCHER), str(settings), str(ready)],
            cwd=work,  # the mini YARN keeps its NodeManager's directories under ./target
            stdin=subprocess.PIPE,  # closed by stop(), or when this Python dies: the JVM then stops the cluster
            env={**os.environ, "JAVA_HOME": str(java_home())},
        )
        return self._wait_until(ready.exists, time.monotonic() + self.start_timeout, tail=400)

    def _started(self) -> None:
        self._write_client_conf()

    def _config(self, work: Path) -> dict[str, str | int]:
        ports = self.ports
        return {
            "minihadoop.dfs.dir": work / "dfs",
            "minihadoop.namenode.port": ports["namenode"],
            "minihadoop.namenode.http.port": ports["namenode_http"],
            "hadoop.tmp.dir": work / "tmp",
            "dfs.replication": 1,
            # every YARN address on loopback, at the ports chosen here (the mini YARN's own choice would be the
            # host name's address)
            "yarn.minicluster.fixed.ports": "true",
            "yarn.resourcemanager.hostname": LOOPBACK,
            "yarn.resourcemanager.address": f"{LOOPBACK}:{ports['rm']}",
            "yarn.resourcemanager.scheduler.address": f"{LOOPBACK}:{ports['rm_scheduler']}",
            "yarn.resourcemanager.resource-tracker.address": f"{LOOPBACK}:{ports['rm_tracker']}",
            "yarn.resourcemanager.admin.address": f"{LOOPBACK}:{ports['rm_admin']}",
            "yarn.resourcemanager.webapp.address": f"{LOOPBACK}:{ports['rm_web']}",
            "yarn.nodemanager.hostname": LOOPBACK,
            "yarn.nodemanager.address": f"{LOOPBACK}:{ports['nm']}",
            "yarn.nodemanager.localizer.address": f"{LOOPBACK}:{ports['nm_localizer']}",
            "yarn.nodemanager.webapp.address": f"{LOOPBACK}:{ports['nm_web']}",
            # small containers, one node: a driver (512 MiB + overhead) and an executor per application
            "yarn.nodemanager.resource.memory-mb": NODE_MEMORY_MB,
            # what the mini YARN's NodeManager really takes: it overwrites the key above with this one (4096 unset)
            "yarn.minicluster.yarn.nodemanager.resource.memory-mb": NODE_MEMORY_MB,
            "yarn.nodemanager.resource.cpu-vcores": 4,
            "yarn.scheduler.minimum-allocation-mb": 128,
            "yarn.scheduler.maximum-allocation-mb": 2048,
            # YARN's default scheduler with one queue (the shaded jar has no capacity-scheduler.xml)
            "yarn.scheduler.capacity.root.queues": "default",
            "yarn.scheduler.capacity.root.default.capacity": 100,
            "yarn.scheduler.capacity.maximum-am-resource-percent": "1.0",  # in cluster mode the driver IS the AM
            "yarn.nodemanager.vmem-check-enabled": "false",
            "yarn.nodemanager.pmem-check-enabled": "false",
            # a shared machine's disk may be fuller than YARN's 90 %: it would mark the node unhealthy
            "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "100.0",
            "yarn.log-aggregation-enable": "false",
            # a stop ends the containers at once (YARN waits for them 6 s, then 5 s for application masters)
            "yarn.nodemanager.sleep-delay-before-sigkill.ms": 100,
            "yarn.nodemanager.process-kill-wait.ms": 500,
        }

    def _write_client_conf(self) -> None:
        """The configuration a client needs (spark-submit's HADOOP_CONF_DIR, `hdfs dfs`, the engine's WebHDFS)."""
        ports = self.ports
        files = {
            "core-site.xml": {"fs.defaultFS": self.hdfs_uri},
            "hdfs-site.xml": {"dfs.namenode.http-address": self.webhdfs_address},
            "yarn-site.xml": {
                "yarn.resourcemanager.hostname": LOOPBACK,
                "yarn.resourcemanager.address": f"{LOOPBACK}:{ports['rm']}",
                "yarn.resourcemanager.scheduler.address": f"{LOOPBACK}:{ports['rm_scheduler']}",
                "yarn.resourcemanager.webapp.address": f"{LOOPBACK}:{ports['rm_web']}",
            },
        }
        self.conf_dir.mkdir(exist_ok=True)
        for name, properties in files.items():
            entries = "".join(
                f"  <property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n"
                for k, v in properties.items()
            )
            (self.conf_dir / name).write_text(f'<?xml version="1.0"?>\n<configuration>\n{entries}</configuration>\n')

    def _stop_request(self, process: subprocess.Popen[bytes]) -> Callable[[], None]:
        """Closing its standard input makes the launcher stop YARN, then HDFS."""
        stdin = process.stdin
        return stdin.close if stdin is not None else process.terminate

    def _after_stop(self) -> None:
        self._end_leftover_containers()

    def _end_leftover_containers(self) -> None:
        """Containers outlive a NodeManager that was killed rather than stopped: SIGKILL every process whose
        working directory is inside this cluster's directory (only this cluster's containers run there)."""
        if self._dir is None:
            return
        for proc in Path("/proc").iterdir():
            try:
                inside = proc.name.isdigit() and self._dir in Path(os.readlink(proc / "cwd")).parents
                if inside:
                    _LOG.warning("ending process %s, a container the mini Hadoop cluster left behind", proc.name)
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:  # gone meanwhile, or not ours to read
                continue

    # --- facts ---

    @property
    def hdfs_uri(self) -> str:
        return f"hdfs://{LOOPBACK}:{self.ports['namenode']}"

    @property
    def webhdfs_address(self) -> str:
        """The NameNode's web endpoint (`host:port`), where WebHDFS answers."""
        return f"{LOOPBACK}:{self.ports['namenode_http']}"

    @property
    def rm_url(self) -> str:
        """The ResourceManager's web address (its REST API is under /ws/v1/cluster)."""
        return f"http://{LOOPBACK}:{self.ports['rm_web']}"

    @property
    def conf_dir(self) -> Path:
        return self._started_dir / "conf"

    def env(self) -> dict[str, str]:
        """The environment of a process that submits to this YARN or reads this HDFS through Hadoop."""
        return {"HADOOP_CONF_DIR": str(self.conf_dir)}

    # --- the ResourceManager's REST API ---

    def application(self, app_id: str) -> dict[str, Any]:
        """The ResourceManager's record of one application: state, finalStatus, diagnostics, amContainerLogs ..."""
        return self._get(f"/ws/v1/cluster/apps/{app_id}")["app"]

    def applications(self) -> list[dict[str, Any]]:
        return (self._get("/ws/v1/cluster/apps").get("apps") or {}).get("app", [])

    def attempts(self, app_id: str) -> list[dict[str, Any]]:
        """The application's attempts (spark.yarn.maxAppAttempts: a driver YARN restarted is a second one)."""
        return self._get(f"/ws/v1/cluster/apps/{app_id}/appattempts")["appAttempts"]["appAttempt"]

    def _get(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.rm_url + path, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.load(response)
        except urllib.error.URLError as e:
            raise HadoopError(f"the mini YARN's ResourceManager did not answer GET {path}: {e}") from None
