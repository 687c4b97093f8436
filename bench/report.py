"""What every benchmark here shares: progress lines, targets with PASS/MISS, and the printed and JSON
report (numbers and ratios against peers measured in the same run)."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Target:
    name: str
    measured: float
    limit: float
    unit: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.measured <= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "result": "PASS" if self.passed else "MISS"}


@dataclass
class Results:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # section, metric, value
    targets: list[Target] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def row(self, section: str, metric: str, value: str) -> None:
        self.rows.append((section, metric, value))


def report(results: Results, path: Path) -> None:
    """Print the table and the verdicts; write the same as JSON to `path`."""
    width = max((len(metric) for _, metric, _ in results.rows), default=0) + 2
    rule = "=" * 110
    print(f"\n{rule}")
    section = None
    for current, metric, value in results.rows:
        if current != section:
            print(f"-- {current}")
            section = current
        print(f"   {metric:<{width}}{value}")
    print("-- targets")
    for target in results.targets:
        status = "PASS" if target.passed else "MISS"
        measured = f"{target.measured:8.2f} {target.unit:<3} (<= {target.limit:g})"
        print(f"   {status}  {target.name:<38} {measured}  {target.detail}")
    missed = [t.name for t in results.targets if not t.passed]
    print(rule)
    verdict = f"{len(results.targets) - len(missed)} of {len(results.targets)} targets met"
    print(verdict + (f"; MISSED: {'; '.join(missed)}" if missed else ""))
    document = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        **results.data,
        "targets": [t.as_dict() for t in results.targets],
        "table": [{"section": sec, "metric": metric, "value": value} for sec, metric, value in results.rows],
    }
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(document, indent=2))
    print(f"results written to {path}")
