"""What the in-process tests share: ledgers the guarded functions write (the effect's own side,
never the returned outcome), and a fresh `Local` over its own SQLite file."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Optional


class Ledger:
    """Effects as the guarded function records them: one entry per effect, by operation key,
    plus every call of the function (an effect is a call that got through)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.effects: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[str] = []

    def call(self, key: str) -> None:
        with self._lock:
            self.calls.append(key)

    def effect(self, key: str, arguments: dict[str, Any]) -> str:
        with self._lock:
            self.effects.append((key, arguments))
            return f"eff_{len(self.effects)}"

    def count(self, key: Optional[str] = None) -> int:
        with self._lock:
            return sum(1 for k, _ in self.effects if key is None or k == key)

    def find(self, key: str) -> Optional[str]:
        """The reference of the effect made under `key`, as a system of record's receipt
        lookup would find it."""
        with self._lock:
            for i, (k, _) in enumerate(self.effects):
                if k == key:
                    return f"eff_{i + 1}"
        return None


class FileLedger:
    """A ledger in a file, appended to by any number of processes: one line per effect, written
    with O_APPEND and fsynced before the function goes on, so a process killed after writing
    it has left it on disk."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def effect(self, key: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def counts(self) -> Counter[str]:
        if not self.path.exists():
            return Counter()
        return Counter(line for line in self.path.read_text().splitlines() if line)

    def has(self, key: str) -> bool:
        return self.counts()[key] > 0
