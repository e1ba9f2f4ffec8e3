"""``python -m verify ARGS`` = ``lowrank-fl verify ARGS``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
