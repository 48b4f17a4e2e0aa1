"""Where the checkout is, for helpers that copy or read it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
