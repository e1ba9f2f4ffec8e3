"""A ``compare`` solve dies with the ``lowrank-fl`` that started it, even inside native code holding the
GIL and under the fork server (whose "alive" pipe each of its children used to hold open, keeping the
server, and so the solve's parent-death signal, alive until the solve ended)."""
import os
import signal
import subprocess
import sys
import textwrap
import time


def test_a_killed_parent_takes_its_native_solve_with_it_under_the_fork_server(tmp_path):
    (tmp_path / "holdmod.py").write_text(textwrap.dedent(f"""
        import ctypes, os
        def hold():
            open({str(tmp_path / 'child.pid')!r}, "w").write(str(os.getpid()))
            ctypes.PyDLL(None).sleep(60)          # native code that holds the GIL for a minute
            return 1
        """))
    (tmp_path / "main.py").write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import holdmod
        from lowrank_fl.compare.child import run_in_child
        if __name__ == "__main__":
            run_in_child(holdmod.hold, (), time_limit=None, measure="rss_growth")
        """))
    env = {**os.environ, "LOWRANK_FL_START_METHOD": "forkserver"}
    main = subprocess.Popen([sys.executable, str(tmp_path / "main.py")], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int((tmp_path / "child.pid").read_text())
        time.sleep(0.3)                                   # the child is inside its native call
        main.send_signal(signal.SIGKILL)
        main.wait(timeout=30)
        gone = time.monotonic() + 10
        while time.monotonic() < gone:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the solve outlived its killed parent by 10 s")
    finally:
        if main.poll() is None:
            main.kill()
