"""The refinement's sentence: what each collaborating client received (``summary.json["refinement"]``),
how far its output is from its own adapter and why (the detection sentence is :mod:`.decision`'s)."""
from __future__ import annotations

__all__ = ["refinement_sentence"]

#: clients named in the refinement sentence (the rest are counted; summary.json has them all)
_LISTED = 10


def refinement_sentence(ref: dict) -> str:
    """One sentence on what the collaborating clients received (``summary.json["refinement"]``):
    how far each output is from the client's own adapter and why."""
    clients = ref["clients"]
    moved = {n: c for n, c in clients.items() if c["weight"] > 0}
    if ref["mode"] == "own":
        return "refinement: refine='own', every client keeps its own adapter."
    out = [n for n, c in clients.items() if c["weight"] == 0 and c["why"].startswith("outside")]
    zero = [n for n, c in clients.items() if c["weight"] == 0 and c["why"].startswith("its update is zero")]
    alone = [n for n, c in clients.items() if c["weight"] == 0 and n not in out and n not in zero]
    if not moved and not out and not zero:
        agree = [c["agreement"] for c in clients.values() if c["agreement"] is not None]
        top = f" (largest agreement {max(agree):.3f})" if agree else ""
        return ("refinement: every client keeps its own adapter: no collaborating client's update "
                f"agrees with the others' mean{top}, so averaging could only replace what it learned.")
    listed = list(moved.items())[:_LISTED]
    parts = ", ".join(f"{n} " + ("(a zero update)" if c["relative_change"] is None else f"{c['relative_change']:.1%}")
                      for n, c in listed)
    if len(moved) > _LISTED:
        changes = [c["relative_change"] for c in moved.values() if c["relative_change"] is not None] or [0.0]
        parts += f", ... ({len(moved)} clients, {min(changes):.1%} to {max(changes):.1%})"
    target = ref["target"]

    def group(names, one, many):
        if not names:
            return ""
        if len(names) == 1:
            return f"; {names[0]} keeps its own adapter ({one})"
        return (f"; {', '.join(names[:_LISTED])}{', ...' if len(names) > _LISTED else ''} "
                f"({len(names)} clients) keep their own adapters ({many})")

    tail = (group(alone, "its update does not agree with the others' mean",
                  "their updates do not agree with the others' mean")
            + group(zero, "its update is zero", "their updates are zero")
            + group(out, "outside the collaborative set", "outside the collaborative set"))
    if len(out) == len(clients):            # an empty set: the detection could not decide (.guard)
        return ("refinement: every client keeps its own adapter: the collaborative set is empty (the "
                "detection could not decide, the sentence above says why).")
    if not moved:                           # the reasons, not "no update agrees", which may not be why
        why = [(alone, "its update does not agree with the others' mean",
                "their updates do not agree with the others' mean"),
               (zero, "its update is zero", "their updates are zero"),
               (out, "it is outside the collaborative set", "they are outside the collaborative set")]
        return "refinement: every client keeps its own adapter: " + "; ".join(
            f"{g[0]}: {one}" if len(g) == 1 else
            f"{', '.join(g[:_LISTED])}{', ...' if len(g) > _LISTED else ''} ({len(g)} clients): {many}"
            for g, one, many in why if g) + "."
    return (f"refinement ({ref['mode']}, toward {target}): relative change of each output from the "
            f"client's own adapter: {parts}{tail}{_exchange_clause(ref)} (summary.json: refinement).")


def _exchange_clause(ref: dict) -> str:
    """Why refine='exchangeable' moved everyone at least its floor, or by agreement alone."""
    ex = ref.get("exchangeability")
    if ref["mode"] != "exchangeable" or not ex:
        return ""
    if ex["statistic"] is None:
        return f"; every weight is the agreement alone ({ex['reason']})"
    if ex["exchangeable"]:
        return (f"; which clients resemble each other does not repeat across modules (p = {ex['p_value']:.3g}): "
                f"their differences look like noise, so each moves at least {ref['floor']:.3g} of the way")
    return (f"; the same clients resemble each other across modules (p = {ex['p_value']:.3g} < {ex['alpha']:g}): "
            "tasks of their own, so each moves by its agreement alone")
