"""The report's provenance finds the commit of a real git checkout, and says precisely why not
otherwise (an installed copy, git missing, git refusing a checkout owned by another user, no
commit yet); reference values come from git itself."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from verify.report.html import render_html
from verify.report.markdown import render_markdown
from verify.report.provenance import BUILD_RECORD, build_record, git_state, git_text, read_head

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="the reference values come from git")


@pytest.fixture(autouse=True)
def _no_user_git_config(monkeypatch, tmp_path):
    """Neither the user's nor the system's git config (a global safe.directory = * would hide
    the ownership check)."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def _git(repo, *args) -> str:
    return subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _clone_like(tmp_path, commits=2) -> Path:
    repo = tmp_path / "clone"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "verify").mkdir()
    for k in range(commits):
        (repo / "verify" / "a.py").write_text(f"x = {k}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"c{k}")
    return repo


def _without_git(monkeypatch, tmp_path, script=None):
    """PATH holding no git (or a fake ``git`` running ``script``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if script is not None:
        fake = bin_dir / "git"
        fake.write_text("#!/bin/sh\n" + script)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_a_clone_gives_its_commit_and_whether_it_is_dirty(tmp_path):
    repo = _clone_like(tmp_path)
    sha = _git(repo, "rev-parse", "HEAD")
    assert git_state(root=repo) == {"commit": sha, "dirty": False}
    (repo / "verify" / "a.py").write_text("x = 99\n")
    assert git_state(root=repo) == {"commit": sha, "dirty": True}
    # the report directory itself is excluded from "dirty"
    assert git_state(repo / "verify", root=repo) == {"commit": sha, "dirty": False}
    assert git_text(git_state(root=repo)) == f"{sha} (dirty: uncommitted changes)"


def test_the_commit_is_read_from_dot_git_when_git_is_missing(tmp_path, monkeypatch):
    repo = _clone_like(tmp_path)
    sha = _git(repo, "rev-parse", "HEAD")
    _git(repo, "tag", "v1")
    _without_git(monkeypatch, tmp_path)
    state = git_state(root=repo)
    assert state["commit"] == sha and state["dirty"] is None
    assert state["reason"] == (f"git is not installed: the commit was read from {repo / '.git'}, "
                               "uncommitted changes were not checked")
    assert read_head(repo) == sha


def test_read_head_follows_packed_refs_detached_heads_and_worktrees(tmp_path):
    repo = _clone_like(tmp_path, commits=3)
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert read_head(repo) == _git(repo, "rev-parse", "HEAD")
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    _git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"), first)
    assert (tmp_path / "wt" / ".git").is_file() and read_head(tmp_path / "wt") == first
    _git(tmp_path / "wt", "switch", "-q", "-c", "side")
    _git(tmp_path / "wt", "commit", "-q", "--allow-empty", "-m", "side")
    assert read_head(tmp_path / "wt") == _git(tmp_path / "wt", "rev-parse", "HEAD") != first
    assert read_head(repo) == _git(repo, "rev-parse", "HEAD")    # the main checkout unchanged
    assert read_head(tmp_path) is None


def test_a_clone_owned_by_another_user(tmp_path, monkeypatch):
    """git refuses it ("dubious ownership"): the commit is still found, and the reason says why
    uncommitted changes were not checked and how to allow the checkout."""
    repo = _clone_like(tmp_path)
    sha = _git(repo, "rev-parse", "HEAD")
    if os.geteuid() == 0:      # really owned by another user
        for p in [repo, *repo.rglob("*")]:
            os.lchown(p, 65534, 65534)
    else:                      # git's own message, from a stand-in git
        _without_git(monkeypatch, tmp_path, script=(
            f"echo \"fatal: detected dubious ownership in repository at '{repo}'\" >&2\n"
            f"echo 'To add an exception for this directory, call:' >&2\nexit 128\n"))
    state = git_state(root=repo)
    assert state["commit"] == sha and state["dirty"] is None
    assert state["reason"] == (
        f"git refuses the checkout {repo}: it is owned by another user (git's safe.directory "
        f"check); `git config --global --add safe.directory {repo}` lets the report check it; "
        "the commit was read from .git, uncommitted changes were not checked")


def test_no_checkout_and_no_commit_yet(tmp_path):
    plain = tmp_path / "site-packages"
    (plain / "verify").mkdir(parents=True)
    state = git_state(root=plain)
    assert state["commit"] is None and state["dirty"] is None
    assert state["reason"].startswith(f"lowrank_fl runs from {plain}, which is not a git checkout")
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert git_state(root=empty) == {"commit": None, "dirty": None,
                                     "reason": f"the git checkout {empty} has no commit yet"}


def test_the_reports_say_the_reason():
    git = {"commit": None, "dirty": None, "reason": "git is not installed and .git has no HEAD"}
    meta = {"provenance": {"git": git, "command": "lowrank-fl verify"}}
    for text in (render_html([], scale="smoke", meta=meta), render_markdown([], scale="smoke", meta=meta)):
        assert "not recorded: git is not installed and .git has no HEAD" in text
        assert "not a git checkout" not in text
    sha = "a" * 40
    git = {"commit": sha, "dirty": None, "reason": "uncommitted changes were not checked"}
    md = render_markdown([], scale="smoke", meta={"provenance": {"git": git}})
    assert f"`{sha}` (uncommitted changes were not checked)" in md
    # reports written before the reason was recorded
    assert git_text({"commit": None, "dirty": None}) == "not a git checkout"


def test_an_installed_copy_reports_the_commit_its_build_recorded(tmp_path):
    site = tmp_path / "site-packages"
    (site / "verify").mkdir(parents=True)
    sha = "b" * 40
    record = site / "verify" / BUILD_RECORD
    record.write_text(json.dumps({"commit": sha, "dirty": False}))
    state = git_state(root=site)
    assert state == {"commit": sha, "dirty": False, "source": "build"}
    assert git_text(state) == f"{sha} (recorded when this installed copy was built: clean)"
    assert git_text({**state, "dirty": True}).endswith("built: with uncommitted changes)")
    # a build without git says why, and the report keeps saying "not recorded"
    record.write_text(json.dumps({"commit": None, "dirty": None, "reason": "built without git"}))
    assert git_state(root=site) == {"commit": None, "dirty": None, "source": "build", "reason": "built without git"}
    assert git_text(git_state(root=site)) == "not recorded: built without git"
    # an unreadable or malformed record is ignored: the copy is not a checkout
    for bad in ("{", json.dumps({"commit": "not-a-sha", "dirty": False}), json.dumps(["x"])):
        record.write_text(bad)
        assert build_record(site) is None
        assert git_state(root=site)["reason"].startswith(f"lowrank_fl runs from {site}, which is not a git checkout")
    # a checkout's own git wins over a stale record
    repo = _clone_like(tmp_path)
    (repo / "verify" / BUILD_RECORD).write_text(json.dumps({"commit": sha, "dirty": False}))
    assert git_state(root=repo)["commit"] == _git(repo, "rev-parse", "HEAD") != sha
