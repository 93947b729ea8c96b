"""``python -m bench [--quick] [--only NAME...] [--json OUT]``: every benchmark, one table."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import main  # noqa: E402  (bench/harness.py)

sys.exit(main())
