"""TensorBoard event files written through the path layer, so a run's scalars land beside its
checkpoints on gs:// as on local disk.

TensorFlow's summary writer reaches GCS only through TensorFlow's own client (no endpoint
override, so untestable offline, and a second storage stack beside gcsfs); an event file is just
a format: TFRecord framing (length, masked CRC-32C of the length, the serialised `Event`, its
masked CRC-32C) around tensorboard's own protos, which import without TensorFlow.

On local disk each flush appends (a live TensorBoard keeps the file open and reads on); an
object store cannot append, so there each flush rewrites the current file whole (one upload: see
atomic_file.py), and past `rotate_bytes` the writer starts the next file (TensorBoard reads the
files of a folder in name order). Scalars are written as TF2 `tf.summary.scalar` writes them
(a float32 tensor with the scalars plugin's metadata).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time

import google_crc32c
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from samtone_jax.core import paths
from samtone_jax.core.atomic_file import write_atomic

log = logging.getLogger(__name__)

_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """One TFRecord: the framing TensorBoard's reader checks."""
    header = struct.pack("<Q", len(data))
    return header + _masked_crc(header) + data + _masked_crc(data)


class EventWriter:
    """`write_scalars(step, {tag: value})`, `flush()`, `close()` into DIRECTORY/events.out.tfevents.*."""

    def __init__(self, directory, start_step: int = 0, rotate_bytes: int = 1 << 20, retry_after_s: float = 60.0):
        """start_step > 0 (a resumed run): the first file starts with TensorBoard's restart marker
        (SessionLog START at start_step + 1), so the steps a killed run logged past its last
        checkpoint are dropped from the curves instead of shown twice."""
        self.directory = paths.as_path(directory)
        self.rotate_bytes, self.retry_after_s = rotate_bytes, retry_after_s
        self._index, self._failed_at = 0, None
        self._start_file()
        if start_step:
            restart = event_pb2.Event(
                wall_time=time.time(),
                step=start_step + 1,
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
            )
            self._data += record(restart.SerializeToString())

    def _start_file(self) -> None:
        # Microseconds in the name: TensorBoard reads a folder's files in name order, and a resumed
        # run's file must sort after the killed run's, even within the same second.
        name = f"events.out.tfevents.{time.time():017.6f}.{socket.gethostname()}.{os.getpid()}.{self._index:04d}"
        self._index += 1
        self.path = self.directory / name
        version = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._data = bytearray(record(version.SerializeToString()))
        self._dirty = False  # written with its first scalars: no file of a header alone

    def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        meta = scalar_metadata.create_summary_metadata(display_name=None, description=None)
        values = []
        for tag, value in scalars.items():
            tensor = tensor_pb2.TensorProto(
                dtype=types_pb2.DT_FLOAT,
                tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                float_val=[float(np.asarray(value, np.float32))],
            )
            values.append(summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta))
        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values))
        self._data += record(event.SerializeToString())
        self._dirty = True

    def flush(self) -> None:
        """Append the new records (local) or rewrite the current file whole (gs://). A failure
        (storage unreachable after the client's retries) is a warning, not the end of the run: the
        events stay in memory, and the next flush `retry_after_s` later tries again (so a storage
        outage does not stall every step)."""
        if not self._dirty or (self._failed_at and time.monotonic() - self._failed_at < self.retry_after_s):
            return
        try:
            if paths.is_remote(self.path):
                write_atomic(self.path, bytes(self._data))
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
                with open(self.path, "ab") as f:  # a local file: records are appended whole
                    f.write(bytes(self._data))
                self._data = bytearray()  # appended: nothing to keep in memory
        except Exception as e:  # noqa: BLE001  TensorBoard is not worth a lost training run
            self._failed_at = time.monotonic()
            log.warning(
                "could not write TensorBoard events to %s (%s: %s); trying again in %.0f s",
                self.path,
                type(e).__name__,
                str(e).splitlines()[0][:200] if str(e) else "",
                self.retry_after_s,
            )
            return
        self._dirty, self._failed_at = False, None
        if paths.is_remote(self.path) and len(self._data) > self.rotate_bytes:
            self._start_file()

    def close(self) -> None:
        self.flush()
