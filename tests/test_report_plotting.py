"""verify.plotting: one style, titles, legible log ticks, off-scale markers, SVG + PNG."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from verify import plotting  # noqa: E402
from verify.claim import Context  # noqa: E402


def _labels(axis):
    return [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]


def test_save_writes_svg_and_png_with_a_title(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9])
    ax.set_xlabel("rounds")
    ax.set_ylabel("error")
    out = plotting.save(fig, tmp_path / "flute.thm5_1.rate.png", title="flute.thm5_1.rate")
    assert out["png"].name == "flute.thm5_1.rate.png" and out["svg"].name == "flute.thm5_1.rate.svg"
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "<svg" in out["svg"].read_text()
    assert fig._suptitle.get_text() == "flute.thm5_1.rate: error vs rounds"
    from PIL import Image

    width = Image.open(out["png"]).size[0]
    assert width > 1.5 * fig.get_figwidth() * 100  # 200 dpi, not the screen's 100
    first = out["svg"].read_bytes()
    plotting.save(fig, tmp_path / "again", title="flute.thm5_1.rate")
    assert (tmp_path / "again.svg").read_bytes() == first  # deterministic SVG
    plt.close(fig)


def test_an_existing_suptitle_gets_the_claim_name(tmp_path):
    fig, ax = plt.subplots()
    fig.suptitle("k = 4 fails")
    ax.plot([1, 2], [1, 2])
    plotting.save(fig, tmp_path / "f", title="flute.fig1.vs_fedrep")
    assert fig._suptitle.get_text() == "flute.fig1.vs_fedrep — k = 4 fails"
    assert (tmp_path / "f.svg").is_file() and (tmp_path / "f.png").is_file()
    plt.close(fig)


def test_log_ticks_do_not_overlap(tmp_path):
    for lo, hi in ((1e-16, 1e3), (0.2, 0.5), (3.0, 40.0)):
        fig, ax = plt.subplots(figsize=(3, 2.5))
        x = np.geomspace(lo, hi, 30)
        ax.loglog(x, x)
        plotting.save(fig, tmp_path / "log", title="t")
        renderer = fig.canvas.get_renderer()
        for axis in (ax.xaxis, ax.yaxis):
            labels = _labels(axis)
            assert len(labels) >= 2, (lo, hi)
            boxes = [t.get_window_extent(renderer) for t in labels]
            assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), (lo, hi)
        plt.close(fig)


def test_off_scale_points_are_marked_and_explained(tmp_path):
    fig, ax = plt.subplots()
    y = np.array([1.0, np.inf, 0.1, np.nan, 0.0, 0.01])
    ax.semilogy(np.arange(6), y, "o-")
    ax.set_xlabel("k")
    plotting.save(fig, tmp_path / "marks", title="t")
    marks = [line for line in ax.get_lines() if line.get_gid() == "unplotted-marker"]
    assert sorted(line.get_marker() for line in marks) == ["^", "v", "x"]
    assert sorted(float(line.get_xdata()[0]) for line in marks) == [1.0, 3.0, 4.0]
    assert "off-scale points: ▲ +inf (1), ▼ -inf or <= 0 (log axis) (1), ✕ nan (1)" in ax.get_xlabel()
    plt.close(fig)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    assert plotting.mark_unplotted(ax) == 0 and ax.get_xlabel() == ""
    plt.close(fig)


def test_context_saves_both_formats(tmp_path):
    ctx = Context(out_dir=tmp_path).for_claim("rolora.sec3_2.eckart_young")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [2, 1])
    rel = ctx.save_figure(fig, title="error against rank")
    assert rel == "figures/rolora.sec3_2.eckart_young.png"
    assert (tmp_path / rel).is_file() and (tmp_path / "figures" / "rolora.sec3_2.eckart_young.svg").is_file()
    assert fig._suptitle.get_text() == "rolora.sec3_2.eckart_young: error against rank"
