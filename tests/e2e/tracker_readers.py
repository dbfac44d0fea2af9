"""Reading what the trackers wrote back, with each library's own record formats (no server, no network).

TensorBoard: an event file is TFRecord framing (u64 length, u32 CRC, payload, u32 CRC) around
`tensorboardX.proto.event_pb2.Event` messages. wandb: an offline run's `run-<id>.wandb` is wandb's
transaction log, the LevelDB log format (32 KiB blocks of CRC/length/type-framed chunks) after a 7-byte
`:W&B` header, around `wandb.proto.wandb_internal_pb2.Record` messages; wandb 0.31 ships no Python
reader for it (its scanner moved into the Go `wandb-core`), so the framing is read here.
"""
import json
import struct
from pathlib import Path


def tensorboard(logdir: Path) -> tuple[dict, dict]:
    """({tag: [(step, value)]}, {tag: text}) from every event file in `logdir`."""
    from tensorboardX.proto.event_pb2 import Event

    scalars, texts = {}, {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
                elif v.metadata.plugin_data.plugin_name == "text":
                    texts[v.tag.split("/")[0]] = v.tensor.string_val[0].decode()
    return scalars, texts


def _wandb_chunks(data: bytes):
    block, pos, record = 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        record += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            yield record
            record = b""


def _value(item):
    kind = item.WhichOneof("value")  # typed values (wandb >= 0.2x) or the older JSON text
    if kind in (None, "value_json", "json"):
        return json.loads(item.value_json or item.json or "null")
    return None if kind == "none" else getattr(item, kind)


def wandb_run(run_dir: Path) -> tuple[list, dict]:
    """(history rows as dicts, the run's config) of an offline run directory."""
    from wandb.proto.wandb_internal_pb2 import Record

    rows, config = [], {}
    (log,) = run_dir.glob("run-*.wandb")
    for chunk in _wandb_chunks(log.read_bytes()):
        rec = Record.FromString(chunk)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): _value(item) for item in rec.history.item})
        elif kind in ("config", "run"):  # the configuration comes with the run record, later changes on their own
            for item in (rec.config if kind == "config" else rec.run.config).update:
                config[item.key] = json.loads(item.value_json)
    return rows, config


def wandb_runs(wandb_dir: Path) -> dict:
    """{run id: (history rows, config)} as `wandb sync` of every `offline-run-*` directory in `wandb_dir` would leave
    the runs, were each directory's branch point applied in the order the directories started (their names): a
    resume's directory (`resume_from`, a branch point in its own run) keeps the run's rows up to the point and goes
    on after it, a fork's (`fork_from`, another run's point) starts a new run with the other's rows up to it."""
    from wandb.proto.wandb_internal_pb2 import Record

    runs = {}
    for run_dir in sorted(wandb_dir.glob("offline-run-*")):
        rows, config = wandb_run(run_dir)
        (log,) = run_dir.glob("run-*.wandb")
        for chunk in _wandb_chunks(log.read_bytes()):
            rec = Record.FromString(chunk)
            if rec.WhichOneof("record_type") == "run":
                run, point = rec.run.run_id, rec.run.branch_point
                break
        before = [row for row in runs[point.run][0] if row["_step"] <= point.value] if point.run else []
        runs[run] = (before + rows, config)
    return runs
