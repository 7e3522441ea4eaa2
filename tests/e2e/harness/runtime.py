"""Running one pod the way kubelet would: sandbox (network namespace, hosts
file, volumes), containers as local processes in their own mount and UTS
namespaces, probes, restarts, status, and graceful deletion.

Volume mounts use a per-container mount namespace (`unshare --mount`) with
bind mounts, not path rewriting: the program sees the paths its manifest names
(/etc/strata/..., /var/run/secrets/..., /etc/hosts), with no knowledge of the
harness, and nothing it mounts leaks out (the root mount here is private; any
shared mount outside the harness' own folder is made a slave first). Why not
rewrite paths: programs, config files and libraries name absolute paths the
harness cannot see. A folder the container needs that this machine lacks
(/var/lib/strata, /etc/app) becomes the container's own private folder (a bind
of <pod>/rootfs/<container>/...), so what it writes there stays with the pod;
only an empty mount point is made here, and removed at teardown. Folders this
machine has (/tmp) are shared with it, as with a hostPath.
"""

from __future__ import annotations

import datetime
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import images
from harness.network import NetworkError, netns_name, netns_path
from harness.podenv import EnvError, container_env, expand
from harness.probes import run_probe
from harness.processes import spawn
from harness.volumes import PodVolumes, VolumeError

if TYPE_CHECKING:
    from harness.agent import Agent, NodeInfo

Obj = dict[str, Any]

BACKOFF_START = 1.0  # seconds; kubelet starts at 10 s, which only slows tests
BACKOFF_MAX = 20.0
REFRESH_EVERY = 10.0
VENV_BIN = Path(images.REPO) / ".venv" / "bin"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ProbeState:
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0


@dataclass
class Container:
    spec: Obj
    init: bool
    runs: bool  # a local process (our image) or a placeholder marked Running
    proc: subprocess.Popen[bytes] | None = None
    restart_count: int = 0
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str = ""
    started_mono: float = 0.0
    finished_at: str = ""
    exit_code: int | None = None
    last_terminated: Obj | None = None
    ready: bool = False
    started: bool = False
    next_start: float = 0.0
    probes: dict[str, ProbeState] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def restartable(self) -> bool:
        return self.spec.get("restartPolicy") == "Always"  # a sidecar init container

    def status(self) -> Obj:
        state: Obj
        if self.state == "running":
            state = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": {"exitCode": self.exit_code, "reason": self.reason,
                                    "startedAt": self.started_at or None, "finishedAt": self.finished_at,
                                    **({"message": self.message} if self.message else {})}}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        out: Obj = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.state == "running" and self.started,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.proc is not None:
            out["containerID"] = f"strata-e2e://{self.proc.pid}"
        return out


class PodRunner:
    """Owns one pod on one node from sandbox creation to object deletion."""

    def __init__(self, agent: Agent, pod: Obj, node: NodeInfo) -> None:
        self.agent, self.pod, self.node = agent, pod, node
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.dir: Path = agent.state / "pods" / self.uid
        self.wake = threading.Event()
        self.gone = False  # the object was removed from the API
        self.ip = ""
        self.netns = ""
        self.own_netns = False
        self.volumes: PodVolumes | None = None
        self.last_status: Obj | None = None
        self.last_refresh = 0.0
        self.setup_error = ""
        self.start_time = ""
        spec = pod["spec"]
        self.host_network = bool(spec.get("hostNetwork"))
        self.hostname = spec.get("hostname") or (node.name if self.host_network else self.name[:63])
        self.subdomain = spec.get("subdomain")
        self.containers = [
            Container(c, True, images.project_image(c.get("image", "")) is not None)
            for c in spec.get("initContainers", [])
        ] + [
            Container(c, False, images.project_image(c.get("image", "")) is not None)
            for c in spec.get("containers", [])
        ]
        self.thread = threading.Thread(target=self._run, name=f"pod {self.namespace}/{self.name}", daemon=True)

    # -- called from the agent's threads -----------------------------------
    def start(self) -> None:
        self.thread.start()

    def update(self, pod: Obj) -> None:
        self.pod = pod
        self.wake.set()

    def vanish(self) -> None:
        """The pod object is gone (force-deleted): stop at once."""
        self.gone = True
        self.wake.set()

    @property
    def deleting(self) -> bool:
        return self.gone or bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def hosts_file(self) -> Path:
        return self.dir / "etc" / "hosts"

    # -- main loop ----------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.deleting and not self.agent.stopping.is_set():
                if not self.ip:
                    self._setup()
                if self.ip:
                    self._tick()
                self._write_status()
                self.wake.wait(0.25 if self.ip else 1.0)
                self.wake.clear()
        except Exception as exc:  # noqa: BLE001 - recorded, then the pod is torn down
            self.agent.log(f"pod {self.namespace}/{self.name}: agent error {exc!r}")
            self.setup_error = f"agent error: {exc!r}"
            if not self.deleting and not self.agent.stopping.is_set():
                self._write_status()
                self.wake.wait()
        finally:
            self._teardown()

    def _setup(self) -> None:
        """Create the sandbox; on a missing source, say why and retry later."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "etc").mkdir(exist_ok=True)
            (self.dir / "logs").mkdir(exist_ok=True)
            self.volumes = PodVolumes(
                pod=self.pod,
                pod_dir=self.dir,
                node_root=self.node.root,
                lookup=lambda kind, name: self.agent.lookup(self.namespace, kind, name),
                request_token=lambda sa, aud, secs: self.agent.request_token(self.pod, sa, aud, secs),
                pvc_path=lambda claim: self.agent.pvc_path(self.namespace, claim),
                csi_publish=lambda vol: self.agent.csi_publish(self, vol),
            )
            self.volumes.prepare()
        except (VolumeError, EnvError, NetworkError, OSError) as exc:
            self.setup_error = str(exc)
            return
        if self.host_network:
            ip, netns = self.node.ip, self.node.netns
        else:
            ip = self.agent.network.allocate(self.node.index)
            netns = ""
            if any(c.runs for c in self.containers):
                netns = netns_name(self.uid)
                try:
                    self.agent.network.add_namespace(netns, ip)
                except NetworkError as exc:
                    self.agent.network.release(ip)
                    self.setup_error = str(exc)
                    return
                self.own_netns = True
        self.netns = netns
        (self.dir / "etc" / "resolv.conf").write_text(self.agent.resolv_conf(self.namespace))
        self.ip = ip
        self.agent.write_hosts(self)
        self.setup_error = ""
        self.start_time = now()

    def _env(self, spec: Obj) -> dict[str, str]:
        base = {
            "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": self.hostname,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        kind = images.project_image(spec.get("image", ""))
        if kind:
            base.update(dict(images.image_config(kind).env))
        base.update(self.agent.service_env())
        pod = dict(self.pod)
        pod["status"] = {**self.pod.get("status", {}), "podIP": self.ip, "podIPs": [{"ip": self.ip}] if self.ip else [],
                         "hostIP": self.node.ip, "hostIPs": [{"ip": self.node.ip}]}
        return container_env(
            pod, spec, lambda k, n: self.agent.lookup(self.namespace, k, n),
            base=base, node_capacity=self.agent.node_capacity,
        )

    # -- containers -----------------------------------------------------------
    def _tick(self) -> None:
        t = time.monotonic()
        if self.volumes and t - self.last_refresh > REFRESH_EVERY:
            self.last_refresh = t
            self.volumes.refresh()
        inits = [c for c in self.containers if c.init]
        for c in inits:
            if c.restartable:
                self._drive(c, t)
                if not c.started:
                    return
                continue
            if c.state == "terminated" and c.exit_code == 0:
                continue
            self._drive(c, t)
            return  # the next init container waits for this one
        for c in self.containers:
            if not c.init:
                self._drive(c, t)

    def _drive(self, c: Container, t: float) -> None:
        """Start, observe, restart and probe one container."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if c.init and not c.restartable:
            policy = "OnFailure" if policy == "Always" else policy
        if c.restartable:
            policy = "Always"
        if c.state == "running" and c.proc is not None and c.proc.poll() is not None:
            self._terminated(c, c.proc.returncode)
        if c.state == "running":
            self._probe(c, t)
            return
        if c.state == "terminated":
            again = policy == "Always" or (policy == "OnFailure" and c.exit_code != 0)
            if not again:
                return
            if c.next_start == 0.0:
                delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** max(0, c.restart_count))
                if c.started_mono and t - c.started_mono > 60:
                    delay = BACKOFF_START
                c.next_start = t + delay
            if t < c.next_start:
                c.last_terminated = c.status()["state"]["terminated"]
                c.state, c.reason = "waiting", "CrashLoopBackOff"
                c.message = f"back-off restarting failed container {c.name}"
                return
        if c.state == "waiting" and c.next_start and t < c.next_start:
            return
        if c.exit_code is not None:
            c.restart_count += 1
        self._start(c)

    def _terminated(self, c: Container, code: int) -> None:
        c.state, c.exit_code, c.finished_at = "terminated", code, now()
        c.reason = "Completed" if code == 0 else ("OOMKilled" if code == -9 else "Error")
        c.ready = False
        c.next_start = 0.0
        c.message = self._termination_message(c)
        self.agent.log(f"pod {self.namespace}/{self.name} container {c.name} exited {code}")

    def _termination_message(self, c: Container) -> str:
        path = self.dir / "termination" / c.name
        text: str
        try:
            text = path.read_text(errors="replace")[:4096]
        except OSError:
            text = ""
        if not text and c.exit_code and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                lines = (self.dir / "logs" / f"{c.name}.log").read_text(errors="replace").splitlines()
                text = "\n".join(lines[-80:])[-2048:]
            except OSError:
                pass
        return text

    def _start(self, c: Container) -> None:
        c.next_start = 0.0
        c.exit_code = None
        c.started_at, c.started_mono = now(), time.monotonic()
        c.ready, c.started = False, not c.spec.get("startupProbe")
        c.probes.clear()
        if not c.runs:
            if c.init and not c.restartable:  # nothing to run: it "completes" at once
                c.state, c.reason, c.exit_code, c.finished_at = "terminated", "Completed", 0, now()
                return
            c.state, c.reason, c.message = "running", "", ""
            c.ready, c.started = True, True
            return
        try:
            c.env = self._env(c.spec)  # recomputed at each start, as kubelet does
        except (EnvError, OSError) as exc:
            c.state, c.reason, c.message = "waiting", "CreateContainerConfigError", str(exc)
            c.next_start = time.monotonic() + 2.0
            return
        try:
            argv = self._argv(c)
        except (OSError, ValueError) as exc:
            c.state, c.reason, c.message = "waiting", "CreateContainerError", str(exc)
            c.next_start = time.monotonic() + BACKOFF_MAX
            return
        c.proc = spawn(argv, self.dir / "logs" / f"{c.name}.log", env=c.env, cwd=Path("/"))
        c.state, c.reason, c.message = "running", "", ""

    def _argv(self, c: Container) -> list[str]:
        kind = images.project_image(c.spec.get("image", ""))
        assert kind is not None
        image = images.image_config(kind)
        cmd = images.container_argv(
            image,
            [expand(a, c.env) for a in c.spec.get("command") or []] or None,
            [expand(a, c.env) for a in c.spec.get("args") or []] or None,
        )
        if not cmd:
            raise ValueError(f"container {c.name}: neither the image nor the pod gives a command")
        if "/" not in cmd[0]:
            found = shutil.which(cmd[0], path=c.env.get("PATH"))
            if not found:
                raise ValueError(f"container {c.name}: executable {cmd[0]!r} not found in PATH {c.env.get('PATH')}")
            cmd[0] = found
        mounts = self._mounts(c)
        workdir = os.path.normpath(c.spec.get("workingDir") or image.workdir)
        script = self._script(c, mounts, workdir, self._scratch_roots(mounts, workdir))
        return [
            "nsenter", f"--net={netns_path(self.netns)}", "--",
            "unshare", "--mount", "--uts", "--propagation", "unchanged", "--",
            "/bin/sh", "-c", script, "sh", *cmd,
        ]

    def _mounts(self, c: Container) -> list[tuple[Path, str, bool]]:
        """(source, target, read-only), parents before children."""
        assert self.volumes is not None
        out: list[tuple[Path, str, bool]] = []
        for m in c.spec.get("volumeMounts", []):
            src = self.volumes.paths[m["name"]]
            sub = m.get("subPath") or (expand(m["subPathExpr"], c.env) if m.get("subPathExpr") else "")
            if sub:
                src = src / sub
                if not src.exists():
                    src.mkdir(parents=True)
            out.append((src, os.path.normpath(m["mountPath"]), bool(m.get("readOnly"))))
        term = self.dir / "termination" / c.name
        term.parent.mkdir(exist_ok=True)
        term.write_bytes(b"")
        out.append((term, c.spec.get("terminationMessagePath", "/dev/termination-log"), False))
        out.sort(key=lambda m: m[1].count("/"))
        return out

    def _scratch_roots(self, mounts: list[tuple[Path, str, bool]], workdir: str) -> list[str]:
        """Folders missing on this machine that the container needs (mount
        targets' parents, its working directory). Each becomes a private,
        writable folder of the container, like a container's own root file
        system: only its empty mount point is made here."""
        roots: set[str] = set()
        for src, target, _ in [*mounts, (Path("/"), workdir, False)]:
            path = Path(target)
            if path.exists():
                continue
            first = next((p for p in reversed(path.parents) if not p.exists()), path)
            if first == path and not src.is_dir():
                self.agent.make_mountpoint(path, directory=False)  # a file target, e.g. /dev/termination-log
            else:
                roots.add(str(first))
        kept = sorted(r for r in roots if not any(r.startswith(o + "/") for o in roots))
        for root in kept:
            self.agent.make_mountpoint(Path(root), directory=True)
        return kept

    def _script(self, c: Container, mounts: list[tuple[Path, str, bool]], workdir: str, scratch: list[str]) -> str:
        q = shlex.quote
        base = str(self.agent.state)
        lines = [
            "set -e",
            # Shared mounts outside the harness folder become slaves, so no
            # mount made here propagates back to the machine.
            f"awk -v base={q(base)} '$0 ~ / shared:/ && index($5, base) != 1 {{print $5}}' /proc/self/mountinfo"
            " | while read -r mp; do mount --make-slave \"$mp\" 2>/dev/null || true; done",
            f"mount --bind {q(str(self.hosts_file))} /etc/hosts",
            f"mount --bind {q(str(self.dir / 'etc' / 'resolv.conf'))} /etc/resolv.conf",
        ]
        for root in scratch:
            private = self.dir / "rootfs" / c.name / root.lstrip("/")
            private.mkdir(parents=True, exist_ok=True)
            lines.append(f"mount --bind {q(str(private))} {q(root)}")
        for src, target, ro in mounts:
            make = f"mkdir -p {q(target)}" if src.is_dir() else f"[ -e {q(target)} ] || {{ mkdir -p {q(os.path.dirname(target))}; : > {q(target)}; }}"
            lines.append(make)
            lines.append(f"mount --bind {q(str(src))} {q(target)}")
            if ro:
                lines.append(f"mount -o remount,bind,ro {q(target)}")
        lines.append(f"hostname {q(self.hostname)}")
        lines.append(f"mkdir -p {q(workdir)} && cd {q(workdir)}")
        lines.append('exec "$@"')
        return "\n".join(lines)

    def exec_prefix(self, c: Container) -> list[str]:
        if c.proc is None:
            return ["false"]
        return ["nsenter", "-t", str(c.proc.pid), "--net", "--mount", "--uts", "--"]

    def _probe(self, c: Container, t: float) -> None:
        if not c.runs:
            return
        spec = c.spec
        kinds = ["startupProbe"] if not c.started else ["livenessProbe", "readinessProbe"]
        if c.started and not spec.get("readinessProbe"):
            c.ready = True
        for kind in kinds:
            probe = spec.get(kind)
            if not probe:
                continue
            st = c.probes.setdefault(kind, ProbeState(next_at=c.started_mono + float(probe.get("initialDelaySeconds", 0))))
            if t < st.next_at:
                continue
            st.next_at = t + float(probe.get("periodSeconds", 10))
            ok = run_probe(probe, pod_ip=self.ip, container=spec, exec_prefix=self.exec_prefix(c), env=c.env)
            if ok:
                st.successes, st.failures = st.successes + 1, 0
            else:
                st.successes, st.failures = 0, st.failures + 1
            passed = st.successes >= int(probe.get("successThreshold", 1))
            failed = st.failures >= int(probe.get("failureThreshold", 3))
            if kind == "startupProbe":
                if passed:
                    c.started = True
                    c.ready = not spec.get("readinessProbe")
                elif failed:
                    self._kill(c, f"startup probe failed {st.failures} times")
            elif kind == "livenessProbe" and failed:
                self._kill(c, f"liveness probe failed {st.failures} times")
            elif kind == "readinessProbe":
                if passed:
                    c.ready = True
                elif failed:
                    c.ready = False

    def _kill(self, c: Container, why: str) -> None:
        self.agent.log(f"pod {self.namespace}/{self.name} container {c.name}: {why}; restarting")
        if c.proc is not None:
            grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            _stop_group(c.proc, grace)
            self._terminated(c, c.proc.returncode if c.proc.returncode is not None else 137)

    # -- status ---------------------------------------------------------------
    def _write_status(self) -> None:
        if self.deleting:
            return
        status = self._status()
        if status == self.last_status:
            return
        self.agent.patch_pod_status(self.pod, status)
        self.last_status = status

    def _status(self) -> Obj:
        inits = [c for c in self.containers if c.init]
        mains = [c for c in self.containers if not c.init]
        initialized = all((c.state == "terminated" and c.exit_code == 0) or (c.restartable and c.started) for c in inits)
        ready = initialized and all(c.ready for c in mains) and all(c.ready for c in inits if c.restartable)
        policy = self.pod["spec"].get("restartPolicy", "Always")
        done = [c for c in mains if c.state == "terminated" or (c.state == "waiting" and c.exit_code is not None and policy == "Never")]
        if self.ip and mains and len(done) == len(mains) and policy != "Always" and all(
            c.exit_code == 0 or policy == "Never" for c in mains
        ):
            phase = "Succeeded" if all(c.exit_code == 0 for c in mains) else "Failed"
        elif self.ip and initialized and any(c.state != "waiting" or c.exit_code is not None for c in mains):
            phase = "Running"
        else:
            phase = "Pending"
        if phase != "Pending" or not self.setup_error:
            waiting_message = ""
        else:
            waiting_message = self.setup_error
        if waiting_message:
            for c in self.containers:
                if c.state == "waiting" and c.exit_code is None:
                    c.reason, c.message = "ContainerCreating", waiting_message

        def cond(kind: str, ok: bool) -> Obj:
            return {"type": kind, "status": "True" if ok else "False"}

        status: Obj = {
            "phase": phase,
            "hostIP": self.node.ip,
            "hostIPs": [{"ip": self.node.ip}],
            "conditions": [
                cond("PodReadyToStartContainers", bool(self.ip)),
                cond("Initialized", initialized),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "containerStatuses": [c.status() for c in mains],
        }
        if inits:
            status["initContainerStatuses"] = [c.status() for c in inits]
        if self.ip:
            status.update({"podIP": self.ip, "podIPs": [{"ip": self.ip}], "startTime": self.start_time})
        if phase in ("Succeeded", "Failed"):
            for c in self.containers:
                c.ready = False
        return status

    # -- teardown ------------------------------------------------------------
    def _teardown(self) -> None:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        if self.gone or self.agent.stopping.is_set():
            grace = 0
        procs = [c.proc for c in self.containers if c.proc is not None and c.proc.poll() is None]
        for p in procs:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + float(grace)
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            _stop_group(p, 0)
        self.agent.csi_unpublish_all(self)
        if self.own_netns:
            self.agent.network.remove_namespace(self.netns)
        if self.ip and not self.host_network:
            self.agent.network.release(self.ip)
        shutil.rmtree(self.dir, ignore_errors=True)
        if not self.gone and not self.agent.stopping.is_set():
            self.agent.finalize_pod(self.pod)
        self.agent.forget(self)


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is None and grace > 0:
        _signal(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
