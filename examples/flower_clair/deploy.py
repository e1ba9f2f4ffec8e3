"""Run the flower_clair app on Flower's deployment engine on this machine and write OUT/summary.json.

A SuperLink and N SuperNodes start as separate processes (insecure, 127.0.0.1, free ports, each
SuperNode with its ``partition-id``), ``flwr run`` submits the app with the settings a run needs
(``n-clients`` = N, ``out-dir``, a shared backbone cache), and the run is followed until Flower
reports it finished. The run's status decides the exit code (``flwr run`` itself can return 0 on
a run that fails). Every process started here — SuperLink, SuperNodes and the ServerApp /
ClientApp processes they spawn, each group in its own session — is stopped at the end, on an
error and on Ctrl-C / SIGTERM. ``--kill-node I --kill-after S`` SIGKILLs SuperNode I (and its
ClientApp) S seconds after the run was submitted: the fault test.

Usage: python deploy.py OUT [--nodes N] [--rounds R] [--kill-node I --kill-after S]
       [--set KEY=VALUE ...] [--timeout SECONDS]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from flower_clair.summary_file import foreign_summary   # standard library only

HERE = Path(__file__).resolve().parent
CONNECTION = "flower-clair-deploy"


class DeployError(RuntimeError):
    """The deployment or the run failed; the message says what and where the logs are."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (the OS picks them)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))          # a TOML basic string (JSON's escapes are TOML's)


def _tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(f"    {line}" for line in lines[-n:])


class Deployment:
    """The processes of one local deployment; :meth:`stop` ends every one of them."""

    def __init__(self, work: Path, logs: Path, env: dict):
        self.work, self.logs, self.env = work, logs, env
        self.procs: dict = {}            # name → Popen (each the leader of its own session)
        self.killed: dict = {}           # name → seconds into the run

    def start(self, name: str, cmd: list[str], home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "w")
        env = dict(self.env, FLWR_HOME=str(home))
        # its own session: the process and the ServerApp/ClientApp processes it spawns are one
        # group, stopped (or killed, for --kill-node) together
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=str(self.work), start_new_session=True)
        log.close()
        self.procs[name] = proc
        # the process groups, for anyone checking afterwards that none is left
        (self.logs / "process_groups.json").write_text(json.dumps({n: p.pid for n, p in self.procs.items()}))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if name not in self.killed and proc.poll() is not None:
                raise DeployError(f"{name} exited with status {proc.returncode}; its log "
                                  f"({self.logs / (name + '.log')}) ends with:\n{_tail(self.logs / (name + '.log'))}")

    def kill(self, name: str, at: float) -> None:
        """SIGKILL a process group (a machine lost: no goodbye to the SuperLink); marked killed
        first, so that :meth:`check_alive` on another thread never takes it for a crash."""
        self.killed[name] = at
        _signal_group(self.procs[name], signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> list[str]:
        """SIGTERM every group, SIGKILL what is left after ``grace`` seconds; the groups still
        alive after that (should be none)."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_group_alive(p) for p in self.procs.values()):
            time.sleep(0.2)
        for proc in self.procs.values():
            if _group_alive(proc):
                _signal_group(proc, signal.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_group_alive(p) for p in self.procs.values()):
            time.sleep(0.2)
        return [n for n, p in self.procs.items() if _group_alive(p)]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)         # the session leader's pid is its group id
    except ProcessLookupError:
        pass


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()                          # reap the leader if it exited
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # pragma: no cover - a reused group id of another user
        return False
    return True


def wait_for_port(port: int, dep: Deployment, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dep.check_alive()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise DeployError(f"the SuperLink did not listen on 127.0.0.1:{port} within {timeout:.0f} s; log:\n"
                      f"{_tail(dep.logs / 'superlink.log')}")


def flwr(args: list[str], env: dict, timeout: float = 120) -> dict:
    """A ``flwr`` CLI call with ``--format json``; its JSON (``success`` checked)."""
    proc = subprocess.run(["flwr", *args, "--format", "json"], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(HERE))
    text = proc.stdout.strip()
    try:
        out = json.loads(text[text.index("{"):]) if "{" in text else {}
    except ValueError:
        out = {}
    if proc.returncode != 0 or not out.get("success"):
        raise DeployError(f"`flwr {' '.join(args)}` failed (exit {proc.returncode}): "
                          f"{out.get('error-message') or (proc.stdout + proc.stderr).strip()[-2000:]}")
    return out


def run_status(run_id: str, env: dict) -> dict:
    runs = flwr(["list", CONNECTION, "--run-id", run_id], env)["runs"]
    if not runs:
        raise DeployError(f"the SuperLink does not know run {run_id}")
    return runs[0]


def save_run_log(run_id: str, env: dict, path: Path) -> None:
    """The run's logs (the ServerApp's, with the strategy's round reports) into ``path``;
    best effort: a failure here only says so."""
    try:
        proc = subprocess.run(["flwr", "log", run_id, CONNECTION, "--show"], env=env, capture_output=True,
                              text=True, timeout=60, cwd=str(HERE))
        path.write_text(proc.stdout + proc.stderr)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"deploy: could not save the run's log ({exc})", file=sys.stderr)


def parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key.replace("_", "-")] = json.loads(value)
        except ValueError:
            out[key.replace("_", "-")] = value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="output directory (summary.json, logs/, backbone/)")
    ap.add_argument("--nodes", type=int, default=5, help="SuperNodes = clients (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="federated rounds (default 2)")
    ap.add_argument("--kill-node", type=int, default=None, metavar="I",
                    help="SIGKILL SuperNode I (its partition id) during the run")
    ap.add_argument("--kill-after", type=float, default=None, metavar="S",
                    help="seconds after the run is submitted to kill --kill-node")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a run-config field of pyproject.toml (e.g. client-rule='\"pooled\"'); JSON values")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the run (default 1800)")
    args = ap.parse_args(argv)
    if args.nodes < 2:
        ap.error(f"--nodes must be >= 2, got {args.nodes}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if (args.kill_node is None) != (args.kill_after is None):
        ap.error("give --kill-node and --kill-after together")
    if args.kill_node is not None and not 0 <= args.kill_node < args.nodes:
        ap.error(f"--kill-node must be a SuperNode index in 0..{args.nodes - 1}, got {args.kill_node}")
    if args.kill_after is not None and args.kill_after < 0:
        ap.error(f"--kill-after must be >= 0 seconds, got {args.kill_after}")
    for tool in ("flower-superlink", "flower-supernode", "flwr"):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not on PATH: install the [flower] extra (pip install \"lowrank_fl[flower]\")")

    out = args.out.resolve()
    summary_path = out / "summary.json"
    if foreign_summary(summary_path):
        ap.error(f"{summary_path} exists and was not written by flower_clair; choose another OUT")
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    config = {"n-clients": args.nodes, "rounds": args.rounds, "contaminated": max(1, args.nodes // 5),
              "out-dir": str(out), "cache-dir": str(out / "backbone")}
    config.update(parse_sets(args.set))
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", PYTHONUNBUFFERED="1")
    # the apps import flower_clair (shipped in the FAB) and lowrank_fl (from this environment:
    # installed, or the checkout this example lives in)
    paths = [str(HERE)] + ([str(HERE.parent.parent)] if (HERE.parent.parent / "lowrank_fl").is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))

    # the backbone, pretrained once into the shared cache the ClientApps read
    t0 = time.perf_counter()
    settings_env = dict(env, FLOWER_CLAIR_SETTINGS=json.dumps({k.replace("-", "_"): v for k, v in config.items()}))
    subprocess.run([sys.executable, "-c", "from flower_clair.task import Settings, backbone; "
                    "backbone(Settings.load())"], env=settings_env, check=True)
    t_pre = time.perf_counter() - t0

    work = Path(tempfile.mkdtemp(prefix="flower_clair_deploy_"))
    dep = Deployment(work, logs, env)
    stopping = {"signal": None}
    killer = None                       # the --kill-node timer

    def on_signal(signum, frame):
        stopping["signal"] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status, run_id, wall, left, submitted = None, None, 0.0, [], time.time()
    try:
        link_port, *node_ports = free_ports(1 + args.nodes)
        dep.start("superlink", ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(link_port),
                                "--disable-runtime-dependency-installation"], work / "superlink")
        wait_for_port(link_port, dep, timeout=120)
        for i, port in enumerate(node_ports):
            dep.start(f"supernode-{i}", ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{link_port}",
                                         "--port", str(port),
                                         "--node-config", f"partition-id={i} num-partitions={args.nodes}"],
                      work / f"supernode-{i}")
        cli_home = work / "cli"
        cli_home.mkdir()
        (cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{link_port}"\ninsecure = true\n')
        run_config = work / "run_config.toml"
        run_config.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in config.items()))
        cli_env = dict(env, FLWR_HOME=str(cli_home))
        started, submitted = time.monotonic(), time.time()
        res = flwr(["run", str(HERE), CONNECTION, "--run-config", str(run_config)], cli_env)
        run_id = str(res["run-id"])
        print(f"deploy: run {run_id} submitted to the SuperLink on 127.0.0.1:{link_port} "
              f"({args.nodes} SuperNodes, {args.rounds} rounds); logs in {logs}", flush=True)
        kill_name = None if args.kill_node is None else f"supernode-{args.kill_node}"
        if kill_name:
            # on a timer of its own: the loop below waits seconds for each `flwr list` under load
            def kill_now():
                at = time.monotonic() - started
                dep.kill(kill_name, at)
                print(f"deploy: SIGKILLed {kill_name} (partition {args.kill_node}) {at:.1f} s into the run",
                      flush=True)

            killer = threading.Timer(max(0.0, args.kill_after - (time.monotonic() - started)), kill_now)
            killer.daemon = True
            killer.start()
        while True:
            elapsed = time.monotonic() - started
            status = run_status(run_id, cli_env)
            if status["status"].startswith("finished"):
                break
            if elapsed > args.timeout:
                raise DeployError(f"run {run_id} not finished after {args.timeout:.0f} s (status "
                                  f"{status['status']}); logs in {logs}")
            dep.check_alive()
            time.sleep(1.0)
        wall = time.monotonic() - started
        save_run_log(run_id, cli_env, logs / "run.log")
        if status["status"] != "finished:completed":
            raise DeployError(f"run {run_id} ended {status['status']!r} ({status.get('status-details') or 'no details'}); "
                              f"the run's log ({logs / 'run.log'}) ends with:\n{_tail(logs / 'run.log', 12)}")
    except KeyboardInterrupt:
        print(f"deploy: interrupted (signal {stopping['signal'] or 'SIGINT'}); stopping the deployment",
              file=sys.stderr)
        return 130
    except DeployError as exc:
        print(f"deploy: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # no second interrupt mid-cleanup
        if killer is not None:
            killer.cancel()                               # the run ended before its time
        left = dep.stop()
        for s, h in old.items():
            signal.signal(s, h)
        shutil.rmtree(work, ignore_errors=True)
        if left:
            print(f"deploy: process groups still alive after stopping: {left}", file=sys.stderr)

    if not summary_path.exists() or summary_path.stat().st_mtime < submitted - 1:
        print(f"deploy: run {run_id} completed but wrote no new {summary_path}", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    summary["deployment"] = {
        "engine": "deployment (SuperLink + SuperNodes, flwr run)", "nodes": args.nodes, "run_id": run_id,
        "status": status["status"], "run_wall_seconds": wall, "pretrain_seconds": t_pre,
        "killed": {"partition": args.kill_node, "after_seconds": dep.killed[f"supernode-{args.kill_node}"]}
        if args.kill_node is not None and dep.killed else None,
        "processes_left": left,
    }
    tmp = summary_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
    os.replace(tmp, summary_path)
    last = summary["rounds"][-1] if summary["rounds"] else {}
    print(f"deploy: run {run_id} {status['status']} in {wall:.1f} s; rounds {[r['round'] for r in summary['rounds']]}; "
          f"flagged {summary['flagged']} (contaminated {summary['contaminated']}); lost nodes "
          f"{summary.get('lost_nodes', [])}; participants of the last round {last.get('participants')}; "
          f"wrote {summary_path}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
