"""The shape plot script runs and writes a PNG."""

from __future__ import annotations

from pathlib import Path

from kinference_simulators import plot_shape


def test_plot_shape_writes_a_png(tmp_path: Path) -> None:
    out = plot_shape.main(["--out", str(tmp_path / "shape.png"), "--duration", "8"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
