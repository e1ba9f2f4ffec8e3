"""OUT/summary.json, the app's one output file: replaced only where this app wrote it (no imports
beyond the standard library: the drivers check it before they start anything)."""
from __future__ import annotations

import json
from pathlib import Path

MARKER = "flower_clair"                   # summary.json files this app wrote carry this key


def foreign_summary(path: Path) -> bool:
    """True when ``path`` exists and this app did not write it (not JSON, or no :data:`MARKER`)."""
    if not path.exists():
        return False
    try:
        return MARKER not in json.loads(path.read_text())
    except (ValueError, OSError, TypeError):
        return True
