"""Reading TensorBoard event files back in tests, with tensorboardX's own protobuf."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto import event_pb2


def scalar_tags(log_dir: Path) -> set[str]:
    """Every summary tag in the TensorBoard event files (TFRecord framing) under `log_dir`."""
    tags: set[str] = set()
    for path in log_dir.rglob("events.out.tfevents*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            tags |= {value.tag for value in event.summary.value}
            at += 12 + length + 4
    return tags
