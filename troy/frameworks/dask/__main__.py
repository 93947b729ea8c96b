"""``python -m troy.frameworks.dask worker|scheduler ...``: the framework's processes."""
from __future__ import annotations

import sys

from troy.frameworks.dask.agent import main

if __name__ == "__main__":
    main(sys.argv[1:])
