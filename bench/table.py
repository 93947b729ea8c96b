"""The plain two-column table the benchmarks print (``measure``, ``result``)."""
from __future__ import annotations


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"{'measure':<{width}}  result")
    print("-" * (width + 30))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
