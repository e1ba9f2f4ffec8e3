"""A module whose import takes 0.5 s of Python-level work (an import a time budget may interrupt)."""
import time

STEPS = []
for _ in range(10):
    time.sleep(0.05)
    STEPS.append(1)
COMPLETE = True
