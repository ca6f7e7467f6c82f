"""The embedded broker for local runs and tests: a real Apache Kafka, one node or
a replicated cluster of three.

One JVM runs KRaft's broker and controller together (``kafka.Kafka``) from the
jars ``make setup`` resolved (``jobs/jars.py``), on loopback listeners only, with
topic auto-creation off. The data directory holds the generated
``server.properties``, the log directory (formatted once, on the first start) and
``broker.json`` (pid and ports), so ``stop`` ends exactly that pid and a later
``start`` finds the topics again.

``start_cluster`` runs three such nodes, each broker and controller of one quorum,
under ``<data_dir>/node-<id>`` (``cluster.json`` keeps the cluster id and the node
count): every topic, internal ones included, gets three replicas and needs two in
sync to take a write, as production runs it (docker-compose.yml). A node can be
killed and restarted by its id (``kill_node``, ``start_node``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jobs.errors import BrokerError
from jobs.jars import broker_classpath, tools_classpath
from jobs.kafka_settings import jaas_quoted
from jobs.local_server import alive, ended, find_free_port, port_is_free, read_state, started
from jobs.settings import REPO_ROOT, java_options

STATE_FILE = "broker.json"
CLUSTER_FILE = "cluster.json"
LOG_FILE = "broker.log"
PROPERTIES_FILE = "server.properties"
LOG_DIR = "kafka-logs"
LOG4J_CONFIG = REPO_ROOT / "include" / "config" / "kafka-log4j2.properties"
# Small heap: a test broker holds a few topics; 10M-record benchmarks fit too.
JVM_OPTIONS = ["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
READY_MARK = "Kafka Server started"
# Launches of a node whose controller port was taken between its choice and the bind.
PORT_ATTEMPTS = 3
# Extra JVM options of the broker's and Kafka's tools' JVMs (the tests use the
# JIT's first tier only: a short-lived JVM starts faster).
EXTRA_ENV = "PLATFORM_BROKER_JAVA_OPTIONS"


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    port: int
    data_dir: Path

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


def _state(data_dir: Path) -> dict[str, int] | None:
    state = data_dir / STATE_FILE
    if not state.exists():
        return None
    try:
        info = json.loads(state.read_text())
        return {key: int(info[key]) for key in ("pid", "started", "port", "controller_port")}
    except (ValueError, KeyError, TypeError):
        return None


def status(data_dir: Path) -> BrokerInfo | None:
    """The running broker of this data directory, or None."""
    info = _state(data_dir)
    if info is None or not alive(info["pid"]) or started(info["pid"]) != info["started"]:
        return None
    return BrokerInfo(pid=info["pid"], port=info["port"], data_dir=data_dir)


# A node of a cluster of several.
CLUSTER_NODE = {
    # A node that died is fenced, and its partitions get new leaders, after 4 s
    # without its heartbeat (Kafka's default waits 9 s; on loopback a heartbeat
    # every 0.5 s is cheap).
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    # The nodes are stopped together (stop_cluster) or killed, never one by one:
    # a controlled shutdown would wait for a controller to move leaders to nodes
    # that are stopping too, and the node left last, without a quorum, waited
    # the full 5 minutes (SIGKILLed after 60 s; measured: 1 stop in 2).
    "controlled.shutdown.enable": "false",
}


def _sasl_listeners(
    port: int, controller_port: int, sasl_users: Mapping[str, str]
) -> dict[str, str]:
    """Clients log in with SASL/PLAIN as one of ``sasl_users``; the broker itself as
    the first."""
    first, password = next(iter(sasl_users.items()))
    users = " ".join(f'user_{name}="{jaas_quoted(secret)}"' for name, secret in sasl_users.items())
    return {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{jaas_quoted(first)}" password="{jaas_quoted(password)}" {users};'
        ),
    }


def server_properties(
    data_dir: Path,
    port: int,
    controller_port: int,
    sasl_users: Mapping[str, str] | None = None,
    node_id: int = 1,
    quorum: Mapping[int, int] | None = None,
) -> str:
    """A KRaft broker and controller on loopback: a static quorum of one, or of
    ``quorum`` (node id -> controller port), whose nodes keep three replicas of
    every topic (two in sync to take a write). ``sasl_users`` (name -> password):
    clients must log in with SASL/PLAIN as one of them (how tests check that
    credentials reach both Kafka clients)."""
    voters = dict(quorum or {node_id: controller_port})
    replicas = str(min(3, len(voters)))
    in_sync = "2" if len(voters) >= 3 else "1"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(
            f"{n}@127.0.0.1:{p}" for n, p in sorted(voters.items())
        ),
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir / LOG_DIR),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "unclean.leader.election.enable": "false",
        # Internal topics: as replicated, and few partitions so that they come up fast.
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
        "group.initial.rebalance.delay.ms": "0",
        # Retention applies within seconds (tests and users who lower a topic's
        # retention see it act; the default checks every 5 minutes).
        "log.retention.check.interval.ms": "5000",
    }
    if len(voters) > 1:
        settings.update(CLUSTER_NODE)
    if sasl_users:
        settings.update(_sasl_listeners(port, controller_port, sasl_users))
    # A properties file reads a backslash as an escape.
    return "".join(
        f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in settings.items()
    )


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise BrokerError("no java on PATH (or JAVA_HOME): install a Java 17+ runtime")
    return java


def java_command(main: str, *args: str, tool: bool = False) -> list[str]:
    """A command line running ``main`` of the broker's jars, or with ``tool`` of
    Kafka's tools' (``org.apache.kafka.tools.consumer.group.ConsumerGroupCommand``)."""
    jars = tools_classpath() if tool else broker_classpath()
    classpath = os.pathsep.join(str(jar) for jar in jars)
    return [
        _java(),
        *JVM_OPTIONS,
        *shlex.split(java_options("BROKER_JAVA_OPTIONS")),
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp",
        classpath,
        main,
        *args,
    ]


def _format_storage(data_dir: Path, properties: Path, cluster_id: str | None = None) -> None:
    """Format the log directory once: a formatted one keeps its cluster id."""
    if (data_dir / LOG_DIR / "meta.properties").exists():
        return
    cluster_id = cluster_id or _cluster_id()
    done = subprocess.run(
        # "--cluster-id=": an id may start with "-", which the tool would take for an option.
        java_command(
            "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(properties)
        ),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise BrokerError(
            f"formatting {data_dir / LOG_DIR} failed: {detail[-1] if detail else done.returncode}"
        )


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _ready(log: Path, offset: int) -> bool:
    with open(log, "rb") as handle:
        handle.seek(offset)
        return READY_MARK.encode() in handle.read()


def start(
    data_dir: Path,
    port: int,
    timeout_s: float = 60.0,
    sasl_users: Mapping[str, str] | None = None,
) -> BrokerInfo:
    """Start the broker on 127.0.0.1:port with its data under data_dir."""
    running = status(data_dir)
    if running is not None:
        if running.port != port:
            raise BrokerError(
                f"a broker for {data_dir} already runs on port {running.port} (pid {running.pid})"
            )
        return running
    if not port_is_free(port):
        raise BrokerError(f"port {port} on 127.0.0.1 is already in use; choose another port")
    data_dir.mkdir(parents=True, exist_ok=True)
    previous = _state(data_dir)
    controller_port = previous["controller_port"] if previous else 0
    for _attempt in range(PORT_ATTEMPTS):
        if controller_port in (0, port) or not port_is_free(controller_port):
            controller_port = find_free_port(avoid=(port,))
        properties = data_dir / PROPERTIES_FILE
        properties.write_text(server_properties(data_dir, port, controller_port, sasl_users))
        _format_storage(data_dir, properties)
        launched = _launch(data_dir, port, controller_port)
        try:
            return _await_ready(launched, timeout_s)
        except BrokerError:
            # The controller's port, free when chosen, was taken before the bind by
            # another process: a static quorum of one takes any other port.
            if not _bind_failed(launched, controller_port):
                raise
            controller_port = 0
    raise BrokerError(
        f"the broker of {data_dir} found no free controller port in {PORT_ATTEMPTS} attempts"
    )


def _bind_failed(launched: _Launched, port: int) -> bool:
    with open(launched.data_dir / LOG_FILE, "rb") as handle:
        handle.seek(launched.log_offset)
        said = handle.read().decode(errors="replace")
    return f"failed to bind to 127.0.0.1:{port}: Address already in use" in said


@dataclass
class _Launched:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    port: int
    log_offset: int


def _launch(data_dir: Path, port: int, controller_port: int) -> _Launched:
    """Start the node of ``data_dir`` (its properties written, its storage formatted)."""
    log_path = data_dir / LOG_FILE
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    offset = log.tell()
    proc = subprocess.Popen(
        java_command("kafka.Kafka", str(data_dir / PROPERTIES_FILE)),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    state = {
        "pid": proc.pid,
        "started": started(proc.pid),
        "port": port,
        "controller_port": controller_port,
    }
    (data_dir / STATE_FILE).write_text(json.dumps(state))
    return _Launched(proc, data_dir, port, offset)


def _await_ready(launched: _Launched, timeout_s: float) -> BrokerInfo:
    proc, log_path = launched.proc, launched.data_dir / LOG_FILE
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrokerError(f"broker exited with code {proc.returncode}; see {log_path}")
        if _ready(log_path, launched.log_offset):
            return BrokerInfo(pid=proc.pid, port=launched.port, data_dir=launched.data_dir)
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise BrokerError(
        f"broker did not start on port {launched.port} within {timeout_s:.0f} s; see {log_path}"
    )


def stop(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the broker of data_dir with SIGTERM (a clean shutdown keeps its data).
    False if none ran."""
    info = status(data_dir)
    if info is None:
        return False
    os.kill(info.pid, signal.SIGTERM)
    ended([info.pid], timeout_s)
    return True


@dataclass(frozen=True)
class ClusterInfo:
    data_dir: Path
    nodes: dict[int, BrokerInfo]  # node id -> the running node

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for _, n in sorted(self.nodes.items()))


def node_dir(data_dir: Path, node_id: int) -> Path:
    return data_dir / f"node-{node_id}"


def _cluster(data_dir: Path) -> dict[str, object] | None:
    return read_state(data_dir / CLUSTER_FILE)


def start_cluster(data_dir: Path, nodes: int = 3, timeout_s: float = 90.0) -> ClusterInfo:
    """Start (or find running) a cluster of ``nodes`` under ``data_dir``: every node
    launched first (a KRaft quorum elects once a majority is up), then awaited. A
    cluster started before keeps its ports and its data."""
    if nodes < 1:
        raise BrokerError(f"a cluster needs at least one node, not {nodes}")
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster = _cluster(data_dir)
    if cluster is not None and int(str(cluster["nodes"])) != nodes:
        raise BrokerError(
            f"{data_dir} holds a cluster of {cluster['nodes']} nodes, not {nodes}: "
            "use another --data-dir"
        )
    if cluster is None:
        # The quorum's addresses are the cluster's for good: chosen once, recorded.
        first = find_free_port(run=2 * nodes)
        cluster = {
            "cluster_id": _cluster_id(),
            "nodes": nodes,
            "ports": {str(n): [first + n - 1, first + nodes + n - 1] for n in range(1, nodes + 1)},
        }
        (data_dir / CLUSTER_FILE).write_text(json.dumps(cluster))
    ports = {int(n): (int(p[0]), int(p[1])) for n, p in dict(cluster["ports"]).items()}  # type: ignore[call-overload]
    quorum = {n: controller for n, (_port, controller) in ports.items()}
    launched: list[_Launched] = []
    running: dict[int, BrokerInfo] = {}
    try:
        for n, (port, controller) in sorted(ports.items()):
            found = status(node_dir(data_dir, n))
            if found is not None:
                running[n] = found
                continue
            if not port_is_free(port) or not port_is_free(controller):
                raise BrokerError(
                    f"node {n}'s ports {port}/{controller} are taken: free them, or use "
                    "another --data-dir"
                )
            where = node_dir(data_dir, n)
            where.mkdir(parents=True, exist_ok=True)
            properties = where / PROPERTIES_FILE
            properties.write_text(server_properties(where, port, controller, None, n, quorum))
            _format_storage(where, properties, str(cluster["cluster_id"]))
            launched.append(_launch(where, port, controller))
        for one in launched:
            running[int(one.data_dir.name.split("-")[1])] = _await_ready(one, timeout_s)
    except BaseException:
        for one in launched:  # none of a half-started cluster stays behind
            with contextlib.suppress(ProcessLookupError):
                one.proc.kill()
            one.proc.wait()
        raise
    return ClusterInfo(data_dir, dict(sorted(running.items())))


def cluster_status(data_dir: Path) -> dict[int, BrokerInfo | None]:
    """Each node of the cluster of ``data_dir`` (None: not running); empty: no cluster."""
    cluster = _cluster(data_dir)
    if cluster is None:
        return {}
    count = int(str(cluster["nodes"]))
    return {n: status(node_dir(data_dir, n)) for n in range(1, count + 1)}


def start_node(data_dir: Path, node_id: int, timeout_s: float = 90.0) -> BrokerInfo:
    """Start one stopped node of the cluster again, on its recorded ports."""
    where = node_dir(data_dir, node_id)
    found = status(where)
    if found is not None:
        return found
    state = _state(where)
    if state is None:
        raise BrokerError(f"{where} holds no node of a cluster")
    return _await_ready(_launch(where, state["port"], state["controller_port"]), timeout_s)


def kill_node(data_dir: Path, node_id: int) -> bool:
    """SIGKILL one node (a crash: no clean shutdown). False if it did not run."""
    info = status(node_dir(data_dir, node_id))
    if info is None:
        return False
    os.kill(info.pid, signal.SIGKILL)
    ended([info.pid], 0)
    return True


def stop_cluster(data_dir: Path, timeout_s: float = 60.0) -> int:
    """Stop every node with SIGTERM at once (a node stopped last and alone could not
    get its controlled shutdown from a quorum); how many ran."""
    running = [info for info in cluster_status(data_dir).values() if info is not None]
    for info in running:
        os.kill(info.pid, signal.SIGTERM)
    ended([info.pid for info in running], timeout_s)
    return len(running)
