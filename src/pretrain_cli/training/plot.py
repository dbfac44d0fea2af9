"""A dependency-free PNG line plot for the loss curve (no matplotlib in the runtime deps)."""
from __future__ import annotations

import struct
import zlib

_COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44)]


def _png(width: int, height: int, rows: list[bytearray]) -> bytes:
    raw = b"".join(b"\x00" + bytes(r) for r in rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def line_plot(series: list[list[tuple[float, float]]], width: int = 640, height: int = 400) -> bytes:
    """Each series is [(x, y), ...]; axes box, no labels (the numbers live in metrics.jsonl)."""
    pts = [p for s in series for p in s]
    rows = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]
    if not pts:
        return _png(width, height, rows)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    m = 30

    def put(x: int, y: int, c) -> None:
        if 0 <= x < width and 0 <= y < height:
            rows[y][3 * x:3 * x + 3] = bytes(c)

    for x in range(m, width - m):  # axes
        put(x, height - m, (0, 0, 0))
    for y in range(m, height - m + 1):
        put(m, y, (0, 0, 0))

    def to_px(p):
        return (m + (p[0] - x0) / (x1 - x0) * (width - 2 * m), height - m - (p[1] - y0) / (y1 - y0) * (height - 2 * m))

    for i, s in enumerate(series):
        c = _COLORS[i % len(_COLORS)]
        px = [to_px(p) for p in s]
        for (ax, ay), (bx, by) in zip(px, px[1:] or px):
            n = int(max(abs(bx - ax), abs(by - ay), 1))
            for k in range(n + 1):
                x, y = round(ax + (bx - ax) * k / n), round(ay + (by - ay) * k / n)
                for dx in (0, 1):
                    for dy in (0, 1):
                        put(x + dx, y + dy, c)
    return _png(width, height, rows)
