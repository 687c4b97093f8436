"""The Hadoop client configuration this process runs with: where HDFS's NameNodes and YARN's ResourceManager
answer over HTTP (WebHDFS, the ResourceManager's REST API), and as whom to ask them. It is read from the same
files Hadoop's own clients and spark-submit read, so the engine talks to the cluster a job is submitted to:

    $HADOOP_CONF_DIR                 (what spark-submit, `hdfs` and `yarn` read)
    $HADOOP_HOME/etc/hadoop          (a Hadoop installation's default)
    ./__spark_conf__/__hadoop_conf__ (inside a YARN container: Spark ships the submitter's configuration there)

The files are core-site.xml, hdfs-site.xml and yarn-site.xml; a key missing in all of them has Hadoop's default.
The user is Hadoop's simple-authentication user: $HADOOP_USER_NAME, else the login name. Kerberos (SPNEGO) and
HTTPS-only clusters are refused with an error that says so: neither is supported by the engine yet."""

from __future__ import annotations

import getpass
import os
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import InvalidInput

CONF_DIR_ENV = "HADOOP_CONF_DIR"
USER_ENV = "HADOOP_USER_NAME"
SPARK_CONTAINER_CONF = Path("__spark_conf__") / "__hadoop_conf__"
FILES = ("core-site.xml", "hdfs-site.xml", "yarn-site.xml")
NAMENODE_HTTP_PORT = 9870  # Hadoop 3's default dfs.namenode.http-address port
RM_WEBAPP_PORT = 8088  # Hadoop's default yarn.resourcemanager.webapp.address port


@dataclass(frozen=True)
class HadoopConf:
    """The merged client configuration and where it came from (for messages)."""

    values: dict[str, str]
    source: str  # the directory read, or "no Hadoop configuration"

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def listed(self, key: str) -> list[str]:
        return [item.strip() for item in (self.get(key) or "").split(",") if item.strip()]

    @property
    def user(self) -> str:
        return os.environ.get(USER_ENV) or getpass.getuser()

    def check_supported(self, what: str) -> None:
        """Refuse what the engine's HTTP clients do not speak: Kerberos (SPNEGO) and HTTPS-only web endpoints."""
        if (self.get("hadoop.security.authentication") or "simple").lower() != "simple":
            raise InvalidInput(
                f"{what}: the Hadoop configuration in {self.source} uses Kerberos, which the engine's WebHDFS and "
                "ResourceManager clients do not support yet: keep this job's checkpoints on S3 or a local path"
            )
        if (self.get("dfs.http.policy") or "HTTP_ONLY").upper() == "HTTPS_ONLY":
            raise InvalidInput(
                f"{what}: the Hadoop configuration in {self.source} serves WebHDFS over HTTPS only "
                "(dfs.http.policy=HTTPS_ONLY), which the engine does not support yet"
            )

    def namenode_http_addresses(self, authority: str) -> list[str]:
        """`host:port` of the NameNode web endpoints (WebHDFS) for an `hdfs://<authority>/` URI: the NameNodes of
        an HA nameservice in their configured order, the one NameNode of a plain `host:port` (its
        `dfs.namenode.http-address` when the configuration describes that NameNode, else Hadoop's default port on
        its host)."""
        if authority in self.listed("dfs.nameservices"):
            namenodes = self.listed(f"dfs.ha.namenodes.{authority}")
            keys = [f"dfs.namenode.http-address.{authority}.{nn}" for nn in namenodes] or [
                f"dfs.namenode.http-address.{authority}"
            ]
            found = [address for key in keys if (address := self.get(key))]
            if not found:
                raise InvalidInput(
                    f"hdfs://{authority}/: the nameservice {authority} in {self.source} names no NameNode web address "
                    f"({', '.join(keys)}): add them to hdfs-site.xml"
                )
            return found
        host = authority.rsplit(":", 1)[0]
        configured = self.get("dfs.namenode.http-address")
        if configured and authority in (self._default_authority(), self.get("dfs.namenode.rpc-address")):
            configured_host, _, port = configured.rpartition(":")
            return [f"{host if configured_host in ('', '0.0.0.0') else configured_host}:{port}"]
        return [f"{host}:{NAMENODE_HTTP_PORT}"]

    def resource_manager_urls(self) -> list[str]:
        """The ResourceManager's web endpoints (its REST API), the active one among them for HA."""
        rm_ids = self.listed("yarn.resourcemanager.ha.rm-ids")
        if (self.get("yarn.resourcemanager.ha.enabled") or "false").lower() == "true" and rm_ids:
            suffixes = [f".{rm_id}" for rm_id in rm_ids]
        else:
            suffixes = [""]
        urls = []
        for suffix in suffixes:
            address = self.get(f"yarn.resourcemanager.webapp.address{suffix}")
            if not address:
                host = self.get(f"yarn.resourcemanager.hostname{suffix}") or "0.0.0.0"
                address = f"{host}:{RM_WEBAPP_PORT}"
            urls.append(f"http://{address}")
        return urls

    def _default_authority(self) -> str | None:
        default = self.get("fs.defaultFS") or ""
        return default.removeprefix("hdfs://").split("/", 1)[0] if default.startswith("hdfs://") else None


def conf_dir() -> Path | None:
    """The directory the client configuration is read from (see the module's doc), or None."""
    candidates = [os.environ.get(CONF_DIR_ENV)]
    if home := os.environ.get("HADOOP_HOME"):
        candidates.append(str(Path(home) / "etc" / "hadoop"))
    candidates.append(str(SPARK_CONTAINER_CONF.absolute()))
    for candidate in candidates:
        if candidate and any((Path(candidate) / name).is_file() for name in FILES):
            return Path(candidate)
    return None


def load() -> HadoopConf:
    """This process's Hadoop client configuration (read once per directory)."""
    directory = conf_dir()
    return _read(str(directory)) if directory is not None else HadoopConf({}, "no Hadoop configuration")


@lru_cache(maxsize=8)
def _read(directory: str) -> HadoopConf:
    values: dict[str, str] = {}
    for name in FILES:
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            root = ElementTree.parse(path).getroot()
        except ElementTree.ParseError as exc:
            raise InvalidInput(f"{path} is not a Hadoop configuration file: {exc}") from None
        for prop in root.iter("property"):
            key, value = prop.findtext("name"), prop.findtext("value")
            if key and value is not None:
                values[key.strip()] = value.strip()
    return HadoopConf(values, directory)
