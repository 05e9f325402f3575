#!/usr/bin/env python3
"""Decode a TensorBoard events file independently of kiln's writer and check it against the
metrics file of the same run.

    tfevents_decode.py EVENTS METRICS.jsonl

Every record's framing is checked with the crc32c package (Debian's python3-crc32c); every
Event is parsed by protobuf (python3-protobuf) from a descriptor built here for tf.Event,
Summary and Summary.Value. Each metrics line's loss, lr, grad_norm, val_loss, ms, tokens_per_s
and mfu must be in the event of its step, equal as a float32 to the decimals the line prints. Prints a one-line summary; exits 1
on the first difference."""
import json
import math
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def masked(data):
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto(name="kiln_tfevent_check.proto", package="check")
    F = descriptor_pb2.FieldDescriptorProto
    value = descriptor_pb2.DescriptorProto(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary = descriptor_pb2.DescriptorProto(name="Summary")
    summary.nested_type.add().CopyFrom(value)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".check.Summary.Value")
    event = descriptor_pb2.DescriptorProto(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".check.Summary")
    f.message_type.add().CopyFrom(summary)
    f.message_type.add().CopyFrom(event)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("check.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    events_path, metrics_path = sys.argv[1], sys.argv[2]
    Event = event_class()
    data = open(events_path, "rb").read()
    at, events = 0, []
    while at < len(data):
        if at + 12 > len(data):
            sys.exit("a record's header is cut at byte %d" % at)
        (n,) = struct.unpack_from("<Q", data, at)
        (lc,) = struct.unpack_from("<I", data, at + 8)
        if lc != masked(data[at:at + 8]):
            sys.exit("the length's CRC at byte %d is wrong" % at)
        body = data[at + 12:at + 12 + n]
        (dc,) = struct.unpack_from("<I", data, at + 12 + n)
        if dc != masked(body):
            sys.exit("the data's CRC at byte %d is wrong" % at)
        e = Event()
        e.ParseFromString(body)
        events.append(e)
        at += 16 + n
    if not events or events[0].file_version != "brain.Event:2":
        sys.exit("the first event is not file_version brain.Event:2")
    by_step = {}
    for e in events[1:]:
        by_step[e.step] = {v.tag: v.simple_value for v in e.summary.value}
    # metric: (tag, the metrics line's printed precision: %.6f, %.6g, %.3f, %.2f, %.5f)
    keys = {"loss": ("train/loss", 5e-7), "lr": ("train/lr", 0), "grad_norm":
            ("train/grad_norm", 5e-7), "val_loss": ("val/loss", 5e-7), "ms":
            ("perf/step_ms", 5e-4), "tokens_per_s": ("perf/tokens_per_s", 5e-3),
            "mfu": ("perf/mfu", 5e-6)}
    checked = 0
    for line in open(metrics_path):
        d = json.loads(line)
        if "event" in d:
            continue
        got = by_step.get(d["step"])
        if got is None:
            sys.exit("no event for step %d" % d["step"])
        for k, (tag, printed) in keys.items():
            if k not in d or d[k] is None:
                continue
            if tag not in got:
                sys.exit("step %d: no %s" % (d["step"], tag))
            want = f32(d[k])
            # float32 against the printed decimals (lr: six significant digits)
            if not math.isclose(got[tag], want, rel_tol=1e-6 if printed else 6e-6,
                                abs_tol=printed + 1e-12):
                sys.exit("step %d: %s is %r, the metrics say %r" % (d["step"], tag, got[tag], d[k]))
            checked += 1
    print("%d records, %d steps, %d scalars equal to the metrics file" %
          (len(events), len(by_step), checked))


if __name__ == "__main__":
    main()
