"""Tables on stdout and CSV files with the environment they were measured in."""

from __future__ import annotations

import csv
import datetime
import math
import os
import platform
from typing import Dict, List, Optional, Sequence

import torch

__all__ = ["environment", "format_table", "write_csv"]


def environment() -> Dict[str, str]:
    """Where a figure was measured: device name, torch/triton versions, date."""
    try:
        import triton  # noqa: F401

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.machine()})"
    return {"device": device, "torch": torch.__version__, "triton": triton_version,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _cell(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return str(v)


def format_table(rows: Sequence[dict], columns: Optional[Sequence[str]] = None) -> str:
    """A GitHub-markdown table of ``rows`` (dicts) with the given column order."""
    columns = list(columns or (rows[0].keys() if rows else []))
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells])


def write_csv(rows: List[dict], path: str, columns: Optional[Sequence[str]] = None) -> str:
    """Write ``rows`` plus the :func:`environment` columns to ``path``; returns the path."""
    env = environment()
    columns = list(columns or (rows[0].keys() if rows else [])) + list(env)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, **env})
    return path
