"""One matplotlib style for the verifier's figures, and how they are saved.

Claims draw with plain matplotlib; :meth:`verify.claim.Context.save_figure` passes the figure to
:func:`save`, which makes every figure of the report look alike and read correctly:

* :data:`STYLE` (rcParams: sizes, grid, colour cycle, deterministic SVG ids) applied by
  :func:`use_style` (claims that want the style while drawing call it or use :func:`style`);
* a title naming the claim (``"<claim id> — <what is shown>"``), axes titles kept as panel titles;
* log axes with decade ticks labelled ``10^k`` only, thinned so labels never overlap, and plain
  ``1, 2, 5`` labels when an axis spans less than a decade;
* points a line cannot show — ``±inf``, ``nan``, and values ``<= 0`` on a log axis, which
  matplotlib drops silently — marked at the edge of the axes (▲ above, ▼ below, ✕ nan) with a
  note saying what the markers mean (:func:`mark_unplotted`);
* written as SVG (vector; embedded in the HTML report) and PNG (:data:`PNG_DPI`) side by side.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib
import numpy as np

__all__ = ["STYLE", "PNG_DPI", "use_style", "style", "save", "tidy_log_axes", "mark_unplotted",
           "thin_overlapping_ticks", "what_is_shown"]

PNG_DPI = 200

STYLE = {
    "figure.dpi": 100,
    "figure.figsize": (6.4, 4.0),
    "figure.titlesize": 11,
    "figure.titleweight": "bold",
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "axes.grid": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=["#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                "#E69F00", "#56B4E9", "#000000", "#999999"]),
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "savefig.bbox": "tight",
    "svg.fonttype": "path",      # glyphs as paths: the SVG looks the same without the fonts
    "svg.hashsalt": "lowrank_fl",  # deterministic ids: the same figure gives the same file
}


def use_style() -> None:
    """Apply :data:`STYLE` to the global rcParams (the verifier's processes draw only reports)."""
    matplotlib.rcParams.update(STYLE)


@contextlib.contextmanager
def style():
    """Context manager drawing with :data:`STYLE` and restoring the previous rcParams."""
    with matplotlib.rc_context(STYLE):
        yield


# ----------------------------------------------------------------------------- log axes
def _decade_formatter(value, _pos=None) -> str:
    if value <= 0 or not np.isfinite(value):
        return ""
    k = np.log10(value)
    if abs(k - round(k)) > 1e-9:
        return ""
    k = int(round(k))
    return {0: "1", 1: "10"}.get(k, f"$10^{{{k}}}$")


def _short_formatter(value, _pos=None) -> str:
    return f"{value:.3g}"


def tidy_log_axes(ax) -> None:
    """Legible ticks on the log axes of ``ax``: decades only, or 1-2-5 within one decade."""
    from matplotlib import ticker

    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if axis.get_scale() != "log":
            continue
        lo, hi = sorted(lim)
        if not (lo > 0 and np.isfinite(hi)):
            continue
        decades = np.log10(hi) - np.log10(lo)
        if decades < 1.0:
            subs = (1.0, 2.0, 5.0) if decades >= 0.7 else np.arange(1, 10) * 1.0
            axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
            axis.set_major_formatter(ticker.FuncFormatter(_short_formatter))
        else:
            axis.set_major_locator(ticker.LogLocator(base=10, numticks=8))
            axis.set_major_formatter(ticker.FuncFormatter(_decade_formatter))
        axis.set_minor_locator(ticker.LogLocator(base=10, subs=np.arange(2, 10) * 1.0, numticks=12))
        axis.set_minor_formatter(ticker.NullFormatter())


def thin_overlapping_ticks(fig) -> None:
    """Hide every other tick label of an axis (repeatedly) while its labels overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for _ in range(4):
                labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
                boxes = [t.get_window_extent(renderer) for t in labels]
                if not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])):
                    break
                for t in labels[1::2]:
                    t.set_visible(False)


# ----------------------------------------------------------------------------- unplottable points
def mark_unplotted(ax) -> int:
    """Mark the points of ``ax``'s lines that matplotlib would drop, at the axes' edge.

    A y value of ``+inf`` gets ▲ at the top, ``-inf`` (or ``<= 0`` on a log y axis) ▼ at the
    bottom, ``nan`` ✕ at the bottom, all at their x position and in their line's colour; a second
    line of the x label explains the markers. Returns the number of points marked.
    """
    from matplotlib.transforms import blended_transform_factory

    trans = blended_transform_factory(ax.transData, ax.transAxes)
    logy = ax.get_yscale() == "log"
    kinds = {"▲ +inf": [], "▼ -inf" + (" or <= 0 (log axis)" if logy else ""): [], "✕ nan": []}
    marks = {"▲ +inf": ("^", 0.98), "✕ nan": ("x", 0.02)}
    count = 0
    for line in list(ax.get_lines()):
        if line.get_gid() == "unplotted-marker":
            continue
        try:
            x = np.asarray(line.get_xdata(), dtype=float)
            y = np.asarray(line.get_ydata(), dtype=float)
        except (TypeError, ValueError):
            continue
        if x.shape != y.shape or x.ndim != 1:
            continue
        ok_x = np.isfinite(x)
        groups = [(np.isposinf(y), "▲ +inf"),
                  (np.isneginf(y) | (logy & np.isfinite(y) & (y <= 0)), list(kinds)[1]),
                  (np.isnan(y), "✕ nan")]
        for mask, key in groups:
            idx = np.flatnonzero(mask & ok_x)
            if idx.size == 0:
                continue
            marker, ypos = marks.get(key, ("v", 0.02))
            ax.plot(x[idx], np.full(idx.size, ypos), linestyle="none", marker=marker, markersize=7,
                    color=line.get_color(), transform=trans, clip_on=False, gid="unplotted-marker")
            kinds[key].append(idx.size)
            count += idx.size
    if count:
        note = ", ".join(f"{k} ({sum(v)})" for k, v in kinds.items() if v)
        label = ax.get_xlabel()
        ax.set_xlabel((label + "\n" if label else "") + "off-scale points: " + note)
    return count


# ----------------------------------------------------------------------------- saving
def what_is_shown(fig) -> str:
    """``"<y label> vs <x label>"`` of a one-panel figure without a title, else ``""``."""
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    if len(axes) != 1 or axes[0].get_title():
        return ""
    y = axes[0].get_ylabel().split("\n")[0].strip()
    x = axes[0].get_xlabel().split("\n")[0].strip()
    return f"{y} vs {x}" if x and y else ""



def save(fig, path, *, title: str | None = None) -> dict:
    """Save ``fig`` as ``<path>.svg`` and ``<path>.png`` (suffix of ``path`` ignored).

    ``title`` becomes the figure's title unless it already has one (``fig.suptitle``); when both
    exist the claim's name is prefixed. A bare name (no ``":"``) on a one-panel figure without an
    axes title gets ``": <y label> vs <x label>"`` appended (:func:`what_is_shown`). Returns ``{"svg": Path, "png": Path}``.
    """
    path = Path(path)
    base = path.with_suffix("") if path.suffix in (".png", ".svg", ".pdf") else path
    # names like "flute.thm5_1.rate" contain dots: append the suffix, never replace one
    base.parent.mkdir(parents=True, exist_ok=True)
    with style():
        own = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
        if title and not own and ":" not in title:
            title = f"{title}: {what_is_shown(fig)}" if what_is_shown(fig) else title
        if title and own and title not in own:
            fig.suptitle(f"{title} — {own}")
        elif title and not own:
            fig.suptitle(title)
        for ax in fig.axes:
            tidy_log_axes(ax)
            mark_unplotted(ax)
        thin_overlapping_ticks(fig)
        out = {"svg": base.with_name(base.name + ".svg"), "png": base.with_name(base.name + ".png")}
        fig.savefig(out["svg"], format="svg", bbox_inches="tight", metadata={"Date": None})
        fig.savefig(out["png"], format="png", dpi=PNG_DPI, bbox_inches="tight")
    return out
