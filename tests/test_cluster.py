"""A Ray cluster of two nodes on this machine, each node in a network namespace the test creates
(joined by a veth pair on a private test subnet, torn down afterwards): trials run on both nodes,
and when the worker node's raylet is killed mid-study its trial moves to the head and resumes from
its checkpoint. Every Ray process stays inside the two namespaces, which hold only loopback and
the veth pair, so nothing of the cluster is reachable from outside (checked by the sockets).

Needs root and iproute2 (`ip netns`); skipped without them."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
import pytest

from harness.store.folder import ResultsFolder
from tests.conftest import _ray_processes, listening, stop_ray_processes

ROOT = Path(__file__).resolve().parent.parent
SUBNET = ipaddress.ip_network("10.213.7.0/24")  # lives only on the veth pair between the two namespaces

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@dataclass(frozen=True)
class Cluster:
    head_ns: str
    worker_ns: str
    head_ip: str
    worker_ip: str
    env: dict[str, str]  # what the nodes run with (private RAY_TMPDIR, the cluster's token)

    @property
    def address(self) -> str:
        return f"{self.head_ip}:6379"

    def run(self, ns: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], env=self.env, capture_output=True, text=True,
                              timeout=120, **kw)


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@contextmanager
def two_node_cluster(ray_env: dict[str, str], cwd: Path) -> Iterator[Cluster]:
    """A head (1 CPU) and a worker node (1 CPU), each started with `ray start` in its own network
    namespace; stopped by PID and the namespaces deleted afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a two-node test cluster needs root and iproute2 (`ip netns`)")
    tag = f"rh{os.getpid()}"
    head_ns, worker_ns = f"{tag}-head", f"{tag}-worker"
    head_ip, worker_ip = str(SUBNET[1]), str(SUBNET[2])
    env = {**ray_env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    cluster = Cluster(head_ns, worker_ns, head_ip, worker_ip, env)
    ray = str(Path(sys.executable).parent / "ray")
    try:
        try:
            _ip("netns", "add", head_ns)
        except subprocess.CalledProcessError as err:  # root in a container without CAP_SYS_ADMIN / NET_ADMIN
            pytest.skip(f"a two-node test cluster needs network namespaces: {err.stderr.strip()}")
        _ip("netns", "add", worker_ns)
        _ip("link", "add", f"{tag}h", "type", "veth", "peer", "name", f"{tag}w")
        for ns, dev, addr in ((head_ns, f"{tag}h", head_ip), (worker_ns, f"{tag}w", worker_ip)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        common = ["--num-cpus", "1", "--disable-usage-stats"]
        for ns, args in ((head_ns, ["--head", "--port", "6379", "--include-dashboard=false"]),
                         (worker_ns, ["--address", cluster.address])):
            ip = head_ip if ns == head_ns else worker_ip
            r = cluster.run(ns, ray, "start", "--node-ip-address", ip, *args, *common, cwd=cwd)
            assert r.returncode == 0, r.stdout + r.stderr
        yield cluster
    finally:  # by PID, this test's processes only: `ray stop` would stop every Ray on the machine
        stop_ray_processes(ray_env["RAY_TMPDIR"])
        for ns in (head_ns, worker_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _netns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def test_two_nodes__trials_run_on_both_and_a_killed_worker_raylet_moves_its_trial_to_the_head(tmp_path, ray_env):
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.mkdir()
    # a trial on the worker node stops after its second chunk (its first checkpointed) and waits
    with two_node_cluster({**ray_env, "RL_HARNESS_HOLD": f"{SUBNET[2]}:{hold}"}, tmp_path) as c:
        # each namespace's identity, read by a process inside it (its own /proc/self, so it cannot have exited)
        head_net, worker_net = (c.run(ns, "readlink", "/proc/self/ns/net").stdout.strip()
                                for ns in (c.head_ns, c.worker_ns))
        assert head_net.startswith("net:[") and worker_net.startswith("net:[") and head_net != worker_net
        # the driver runs beside the head; 2 trials at a time (one per node), each checkpointing every chunk
        proc = subprocess.Popen(
            ["ip", "netns", "exec", c.head_ns, sys.executable, "-m", "harness.study", "cartpole_ppo",
             "--trials", "2", "--configs-per-trial", "2", "--seeds", "2", "--timesteps", "20480", "--no-asha",
             "--checkpoint-every", "1chunk", "--top-k", "0", "--address", c.address, "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=c.env, cwd=ROOT)
        try:
            deadline = time.monotonic() + 400

            def wait_for(found):
                while (x := found()) is None:
                    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
                    time.sleep(0.1)
                return x

            wait_for(lambda: next(hold.glob("hold-*"), None))  # the worker's trial waits, mid-run
            sockets = listening([proc.pid, *_ray_processes(ray_env["RAY_TMPDIR"])])
            # read while they live (a PID that exited since reads "" and no longer listens)
            socket_nets = {pid: net for pid, _, _ in sockets if (net := _netns(pid))}
            addresses = {ns: _ip("-n", ns, "-o", "addr").split() for ns in (c.head_ns, c.worker_ns)}
            on_worker = [int(p) for p in _ip("netns", "pids", c.worker_ns).split()]
            raylets = [p for p in on_worker if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"]
            assert len(raylets) == 1, raylets
            for pid in on_worker:  # the worker node dies (its raylet and its workers) with a trial mid-run on it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            log, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, log
    # the retry says what failed (Ray's word on the lost actor), not "no error text"
    retry = [ln for ln in log.splitlines() if "retrying from its last checkpoint" in ln]
    assert len(retry) == 1 and "The actor " in retry[0] and "no error text" not in retry[0], retry

    # nothing of the cluster listens outside the two namespaces, which hold loopback and the test subnet only
    assert set(socket_nets.values()) <= {head_net, worker_net}, (socket_nets, sockets)
    assert set(socket_nets.values()) == {head_net, worker_net}, socket_nets  # both nodes' processes were seen
    assert {pid for pid, _, _ in sockets} >= {proc.pid}, sockets  # the driver's own ports, in the head's namespace
    for ns, words in addresses.items():
        nets = [ipaddress.ip_interface(w) for prev, w in zip(words, words[1:], strict=False)
                if prev in ("inet", "inet6")]
        assert all(n.ip.is_loopback or n.ip in SUBNET or n.ip.is_link_local for n in nets), (ns, nets)

    records = ResultsFolder(out / "cartpole_ppo").trials()
    assert sorted(r.trial for r in records) == [0, 1] and {r.status for r in records} == {"complete"}
    moved = [r for r in records if r.nodes == [c.worker_ip, c.head_ip]]
    assert len(moved) == 1, [(r.trial, r.nodes) for r in records]  # moved to the head ...
    resumed = moved[0]
    assert resumed.resumed_after_chunk >= 1  # ... and went on from its checkpoint, not from step 0
    assert [row["chunk"] for row in resumed.curves] == list(range(1, 5))  # every chunk's curve, once
    assert {ip for r in records for ip in r.nodes} == {c.head_ip, c.worker_ip}

    # no configuration counted twice, in Optuna or in the reports
    storage = f"sqlite:///{out / 'cartpole_ppo' / 'optuna.db'}"
    ostudy = optuna.load_study(study_name="cartpole_ppo", storage=storage)
    assert [t.state.name for t in ostudy.trials] == ["COMPLETE"] * 4
    numbers = [cfg.optuna_number for r in records for cfg in r.configs]
    assert sorted(numbers) == list(range(4))
    configs = pd.read_csv(out / "cartpole_ppo" / "reports" / "configs.csv")
    assert len(configs) == 4 and configs.config_id.is_unique
