"""The one reader: packed chunks, v1 runs, damaged and hostile records, many files, incremental updates."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import shutil
import time

import numpy as np
import pytest
from synthetic_runs import write_gpu_run, write_writers
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from rnnmon.format import packing, schema
from rnnmon.format.eventfile import EventFileAppender, frame, scan_records
from rnnmon.format.logdir import read_logdir
from rnnmon.format.reader import RunReader, open_logdir, read_runs
from rnnmon.format.writer import SummaryWriter

T0 = 1_790_000_000.0


def _steps(n: int, *, fits: int = 1, epochs: int = 2, batches: int = 1, seed: int = 0) -> np.ndarray:
    """Step rows as the monitor records them: new fits and epochs, unmeasured waits, a host gap between steps."""
    rng = np.random.default_rng(seed)
    rows, end, step = [], T0, 0
    for i in range(n):
        new_fit = i % (n // fits) == 0
        epoch = (i % (n // fits)) * epochs // (n // fits)
        boundary = i > 0 and not new_fit and epoch != rows[-1][1]
        begin = end + (0.7 if new_fit or boundary else rng.uniform(0, 1e-3))
        step += batches
        wait = np.nan if i % 9 == 0 else rng.uniform(0, 20)
        gap = np.nan if new_fit else (0.0 if boundary else (begin - end) * 1e3)
        end = begin + rng.uniform(1e-3, 0.03)
        rows.append((step, epoch, begin, end, wait, gap, batches))
    return np.array(rows)


def _event(tag: str, tensor: tensor_pb2.TensorProto, step: int, plugin: str = schema.PLUGIN_NAME,
           content: bytes = b'{"version": 1}') -> bytes:
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    value.metadata.plugin_data.plugin_name = plugin
    value.metadata.plugin_data.content = content
    value.metadata.data_class = summary_pb2.DATA_CLASS_TENSOR
    event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value]))
    return event.SerializeToString()


def _double(rows: np.ndarray, shape: list[int] | None = None) -> tensor_pb2.TensorProto:
    shape = list(rows.shape) if shape is None else shape
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_content=rows.astype("<f8").tobytes(),
                                  tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                      dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in shape]))


def _text(value: str) -> tensor_pb2.TensorProto:
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[value.encode()])


def _healthy(logdir, name: str = "healthy") -> np.ndarray:
    rows = _steps(300)
    writer = SummaryWriter(str(logdir / name / "rnnmon"))
    writer.json(schema.RUN_TAG, {"status": "finished", "start": T0, "pid": 1})
    writer.flush()
    writer.table(schema.STEPS_TAG, rows)
    writer.close()
    return rows


@pytest.mark.parametrize("batches", [1, 8])
def test_packed_steps_keep_every_column_to_a_microsecond(batches):
    rows = _steps(2000, fits=2, epochs=3, batches=batches)
    blob = packing.encode(schema.STEPS_TAG, rows)
    assert len(blob) < 12.5 * len(rows)  # 12 bytes a step; a few whole rows where fits and epochs begin
    decoded = packing.decode(schema.STEPS_TAG, blob)
    np.testing.assert_array_equal(decoded[:, [0, 1, 6]], rows[:, [0, 1, 6]])
    np.testing.assert_allclose(decoded[:, 2:4], rows[:, 2:4], rtol=0, atol=1.5e-6)
    np.testing.assert_allclose(decoded[:, 4:6], rows[:, 4:6], rtol=0, atol=1.5e-3)  # ms to the µs
    np.testing.assert_array_equal(np.isnan(decoded[:, 4:6]), np.isnan(rows[:, 4:6]))


def test_runs_written_in_format_version_1_still_read(tmp_path):
    rows = _steps(50)
    gaps = np.array([[-1, T0, T0 + 0.02, 0], [-1, T0 + 1, T0 + 1.5, 2]])
    with EventFileAppender(str(tmp_path / "old" / "rnnmon")) as out:
        out.add(_event(schema.RUN_TAG, _text(json.dumps({"version": 1, "status": "finished", "start": T0})), 1))
        out.add(_event(schema.STEPS_TAG, _double(rows[:20]), 2))
        out.add(_event(schema.STEPS_TAG, _double(rows[20:]), 3))
        out.add(_event(schema.GAPS_TAG, _double(gaps), 4))
        out.add(_event(f"{schema.UTIL_TAG_PREFIX}0", _double(np.array([[T0, 50.0]])), 5,
                       content=b'{"version": 1, "device": {"index": 0, "name": "A100"}}'))
    provider, ctx = open_logdir(str(tmp_path))
    for run in (read_logdir(str(tmp_path))["old/rnnmon"], read_runs(provider, ctx)["old/rnnmon"]):
        assert run.errors == [] and run.info["status"] == "finished"
        np.testing.assert_array_equal(run.steps, rows)
        np.testing.assert_array_equal(run.gaps, gaps)
        assert run.devices[0]["name"] == "A100"


def test_files_and_data_provider_read_the_same_run(tmp_path):
    rows = _healthy(tmp_path)
    provider, ctx = open_logdir(str(tmp_path))
    from_files, from_provider = read_logdir(str(tmp_path))["healthy/rnnmon"], read_runs(provider, ctx)["healthy/rnnmon"]
    np.testing.assert_array_equal(from_files.steps, from_provider.steps)
    np.testing.assert_allclose(from_files.steps[:, 2:4], rows[:, 2:4], atol=1.5e-6, rtol=0)
    assert from_files.info == from_provider.info and from_files.fits == from_provider.fits == 1


def test_a_record_claiming_a_huge_shape_is_refused_at_once(tmp_path):
    _healthy(tmp_path)
    hostile = tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[1.0], tensor_shape=(
        tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in (10**9, 7)])))
    with EventFileAppender(str(tmp_path / "hostile" / "rnnmon")) as out:
        out.add(_event(schema.STEPS_TAG, hostile, 1))
        out.add(_event(schema.STEPS_TAG, _double(np.zeros((0, 7)), [4000, 7]), 2))  # shape without the bytes
        out.add(_event(schema.GAPS_TAG, _text("rnm2" + "x" * 40), 3))  # a packed header that lies
    cpu_s, peak_kib = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    runs = read_logdir(str(tmp_path))
    assert time.process_time() - cpu_s < 2  # CPU time, which the machine's load leaves alone: was 23 s ...
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kib < 200 << 10  # ... and 3.7 GB
    errors = runs["hostile/rnnmon"].errors
    assert len(errors) == 3 and all(e.startswith(("rnnmon/steps", "rnnmon/gaps")) for e in errors), errors
    assert "10^9" in errors[0] or "1000000000" in errors[0]
    assert len(runs["healthy/rnnmon"].steps) == 300 and runs["healthy/rnnmon"].errors == []


def _one_file(run_dir) -> str:
    (name,) = [n for n in os.listdir(run_dir) if "tfevents" in n]
    return os.path.join(run_dir, name)


def _flip(path, offset: int, bits: int) -> None:
    """XOR the byte at `offset` of the file at `path` with `bits`: one damaged byte."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ bits]))


def test_truncated_and_bit_flipped_files_are_errors_of_their_run(tmp_path):
    _healthy(tmp_path)
    for name in ("cut", "flipped", "length"):
        _healthy(tmp_path, name)
    cut = _one_file(tmp_path / "cut" / "rnnmon")
    with open(cut, "r+b") as f:
        f.truncate(os.path.getsize(cut) - 100)
    os.utime(cut, (time.time() - 60, time.time() - 60))  # not a live writer's half-written record
    flipped = _one_file(tmp_path / "flipped" / "rnnmon")
    _flip(flipped, os.path.getsize(flipped) // 2, 0x10)
    length = _one_file(tmp_path / "length" / "rnnmon")
    before = scan_records(length).records[:-1]  # the steps chunk comes last: flip a bit of its length field
    _flip(length, sum(12 + len(record) + 4 for record in before) + 1, 0x01)
    runs = read_logdir(str(tmp_path))
    assert runs["healthy/rnnmon"].errors == []
    assert any("truncated" in e for e in runs["cut/rnnmon"].errors), runs["cut/rnnmon"].errors
    assert any("checksum mismatch" in e for e in runs["flipped/rnnmon"].errors), runs["flipped/rnnmon"].errors
    assert any("corrupt record header" in e for e in runs["length/rnnmon"].errors), runs["length/rnnmon"].errors
    for name in ("cut", "flipped", "length"):  # lost: the damaged record (the steps chunk); the records before it read
        assert runs[f"{name}/rnnmon"].info["status"] == "finished" and len(runs[f"{name}/rnnmon"].steps) == 0


def test_a_live_writers_half_written_record_is_not_an_error_yet(tmp_path):
    _healthy(tmp_path, "live")
    path = _one_file(tmp_path / "live" / "rnnmon")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    run = read_logdir(str(tmp_path))["live/rnnmon"]
    assert run.errors == [] and run.info["status"] == "finished" and len(run.steps) == 0


@pytest.mark.parametrize(("tag", "tensor", "complaint"), [
    (schema.RUN_TAG, _text("[1, 2]"), "not a JSON object"),
    (schema.RUN_TAG, _text('{"idle_pct": "low"}'), "idle_pct"),
    (schema.RUN_TAG, _text('{"fetch_floor_ms": "0.3"}'), "fetch_floor_ms"),
    (schema.FINDINGS_TAG,
     _text(json.dumps([{"code": "X", "severity": "fatal", "where": "", "message": "", "advice": ""}])), "severity"),
    (schema.ALERTS_TAG, _text('["firing"]'), "not a JSON object"),
    (schema.ALERTS_TAG, _text('[{"rule": "idle_gap", "start": "soon"}]'), "start"),
    (schema.SHAPES_TAG, _text('[{"step": 3, "time": "soon", "shapes": []}]'), "input shape"),
    (schema.SHAPES_TAG, _text('[{"step": 3, "time": 1.0, "shapes": [[32, "x"]]}]'), "input shapes"),
    (schema.GAPS_TAG, _double(np.array([[0, T0, T0 + 1, np.nan]])), "cause"),
    (schema.PHASES_TAG, _double(np.array([[7, T0, T0 + 1]])), "kind"),
    (schema.STEPS_TAG, _double(np.array([[1, 0, T0, T0 + 1, 0, 0, np.nan]])), "batch"),
    ("rnnmon/util/gpuX", _double(np.array([[T0, 5.0]])), "device"),
    (schema.STEPS_TAG, _text("not packed"), "string where a table"),
    (schema.STEPS_TAG, tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, int_val=[1]), "dtype"),
])
def test_an_invalid_record_is_an_error_of_its_run_only(tmp_path, tag, tensor, complaint):
    from rnnmon.report import build_report, render_text

    _healthy(tmp_path)
    with EventFileAppender(str(tmp_path / "damaged" / "rnnmon")) as out:
        out.add(_event(schema.RUN_TAG, _text('{"status": "finished"}'), 1))
        out.add(_event(tag, tensor, 2))
    report = build_report(str(tmp_path))
    runs = {run["run"]: run for run in report["runs"]}
    assert runs["healthy/rnnmon"]["errors"] == [] and runs["healthy/rnnmon"]["steps"] == 300
    assert len(runs["damaged/rnnmon"]["errors"]) == 1 and tag in runs["damaged/rnnmon"]["errors"][0]
    assert complaint in runs["damaged/rnnmon"]["errors"][0]
    assert "error reading " + tag in render_text(report)
    json.dumps(report)


@pytest.mark.slow
def test_ten_thousand_files_read_in_seconds(tmp_path):
    run_dir = tmp_path / "many" / "rnnmon"
    writer = SummaryWriter(str(run_dir))  # one fit per file, as a job restarted 10,000 times leaves them
    writer.table(schema.STEPS_TAG, _steps(3))
    writer.close()
    template = _one_file(run_dir)
    records = [event_pb2.Event.FromString(record) for record in scan_records(template).records]
    for i in range(1, 10_000):
        for event in records:
            if event.HasField("summary"):
                event.step += 1  # each fit stamps its own chunks
        with open(f"{template}.{i:05d}", "wb") as f:
            f.write(b"".join(frame(event.SerializeToString()) for event in records))
    cpu_s = time.process_time()
    run = read_logdir(str(tmp_path))["many/rnnmon"]
    cpu_s = time.process_time() - cpu_s
    assert len(run.steps) == 30_000 and run.errors == [] and run.notes == []
    assert cpu_s < 60, cpu_s  # CPU time: was 342 s and growing faster than the file count; ~5 s on a 2-core host


def test_run_reader_decodes_only_new_chunks(tmp_path):
    run_dir = str(tmp_path / "live" / "rnnmon")
    rows = _steps(400)
    writer = SummaryWriter(run_dir)
    reader = RunReader("live/rnnmon")
    for first in range(0, 400, 100):
        writer.table(schema.STEPS_TAG, rows[first:first + 100])
        writer.flush()
        before = reader.chunks_decoded
        data = reader.update_from_files(run_dir)
        assert reader.chunks_decoded == before + 1 and len(data.steps) == first + 100
    assert reader.update_from_files(run_dir).steps.shape == (400, 7) and reader.chunks_decoded == 4
    writer.close()
    np.testing.assert_allclose(data.steps[:, 2:4], rows[:, 2:4], atol=1.5e-6, rtol=0)


def test_run_reader_over_the_data_provider_decodes_only_new_chunks(tmp_path):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, event_accumulator, plugin_event_multiplexer

    run_dir = str(tmp_path / "live" / "rnnmon")
    writer = SummaryWriter(run_dir)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(size_guidance={event_accumulator.TENSORS: 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    reader, rows = RunReader("live/rnnmon"), _steps(300)
    for first in range(0, 300, 100):
        writer.table(schema.STEPS_TAG, rows[first:first + 100])
        writer.flush()
        multiplexer.Reload()
        data = reader.update_from_provider(provider, context.RequestContext())
        assert len(data.steps) == first + 100 and reader.chunks_decoded == first // 100 + 1
    writer.close()


def test_scan_resumes_after_a_half_written_record(tmp_path):
    with EventFileAppender(str(tmp_path)) as out:
        out.add(b"one")
        out.add(b"two")
    path = out.path
    data = pathlib.Path(path).read_bytes()
    with open(path, "wb") as f:
        f.write(data[:-5])
    first = scan_records(path)
    assert first.records == [b"one"] and first.truncated and first.problem is None
    with open(path, "ab") as f:
        f.write(data[-5:])
    assert scan_records(path, first.offset).records == [b"two"]


def test_check_files_finds_the_damage_the_data_provider_hides(tmp_path):
    _healthy(tmp_path, "flipped")
    path = _one_file(tmp_path / "flipped" / "rnnmon")
    _flip(path, os.path.getsize(path) // 2, 0x10)
    provider, ctx = open_logdir(str(tmp_path))
    reader = RunReader("flipped/rnnmon")
    assert reader.update_from_provider(provider, ctx).errors == []  # TensorBoard's loader says nothing
    assert any("checksum mismatch" in e for e in reader.check_files(str(tmp_path / "flipped" / "rnnmon")))
    assert reader.check_files(str(tmp_path / "flipped" / "rnnmon")) == reader.data().errors  # no new bytes read


def _steps_row_by_row(blob: bytes) -> np.ndarray:
    """docs/format.md's steps chunk decoded one row at a time: the reference the batched decoder must equal."""
    import struct
    import zlib

    magic = blob[:4]
    if magic in (b"rnm4", b"rnm5"):  # version 5: magic, layout, rows, anchor, exceptions; a raw deflate stream
        _, layout, rows, _, exceptions = struct.unpack_from("<4sBIdI", blob)
        head, wbits = 21, -15
    else:
        _, layout, rows, exceptions, _ = struct.unpack_from("<4sB3xIId", blob)
        head, wbits = 24, 15
    body = zlib.decompress(blob[head:], wbits) if layout & 0x80 else blob[head:]
    if magic in (b"rnm3", b"rnm5"):  # byte planes: field f's byte b of row r at (4f + b) * rows + r
        planes = np.frombuffer(body[: 12 * rows], dtype=np.uint8).reshape(3, 4, rows)
        compact = np.ascontiguousarray(planes.transpose(2, 0, 1)).view("<i4").reshape(rows, 3)
    else:
        compact = np.frombuffer(body[: 12 * rows], dtype="<i4").reshape(rows, 3)
    whole = dict(zip(*(lambda e: (e[:, 0].astype(int), e[:, 1:]))(
        np.frombuffer(body[12 * rows:], dtype="<f8").reshape(exceptions, 8))))
    out, base, since_us = [], None, 0
    for i, (duration_us, wait_us, gap_us) in enumerate(compact.tolist()):
        if i in whole:
            base, since_us, k = whole[i], 0, 0
            out.append(base)
            continue
        since_us, k = since_us + gap_us + duration_us, k + 1
        end = base[3] + since_us / 1e6
        out.append([base[0] + k * base[6], base[1], end - duration_us / 1e6, end,
                    np.nan if wait_us < 0 else wait_us / 1e3, gap_us / 1e3, base[6]])
    return np.array(out).reshape(-1, 7)


def test_a_run_decoded_in_one_batch_equals_its_chunks_decoded_one_by_one(tmp_path):
    # A report reads all chunks of a tag in one batch; the rows must be exactly those of each chunk on its own.
    run_dir = str(tmp_path / "run" / "rnnmon")
    rows = _steps(3000, fits=3, epochs=4, batches=2, seed=1)
    gaps = np.array([[-1, T0 + i, T0 + i + 0.01 * (i % 7), i % 4] for i in range(900)], dtype=float)
    writer = SummaryWriter(run_dir)
    for first in range(0, 3000, 250):  # twelve chunks, each starting mid-epoch or at a new fit
        writer.table(schema.STEPS_TAG, rows[first:first + 250])
        writer.table(schema.GAPS_TAG, gaps[first * 3 // 10:(first + 250) * 3 // 10])
        writer.flush()
    writer.close()
    chunks: dict[str, list[bytes]] = {schema.STEPS_TAG: [], schema.GAPS_TAG: []}
    for record in scan_records(_one_file(run_dir)).records:
        for value in event_pb2.Event.FromString(record).summary.value:
            if value.tag in chunks:
                chunks[value.tag].append(value.tensor.string_val[0])
    assert len(chunks[schema.STEPS_TAG]) == len(chunks[schema.GAPS_TAG]) == 12
    run = read_logdir(str(tmp_path))["run/rnnmon"]
    assert run.errors == []
    np.testing.assert_array_equal(run.steps, np.concatenate([_steps_row_by_row(b) for b in chunks[schema.STEPS_TAG]]))
    np.testing.assert_array_equal(run.steps, np.concatenate([packing.decode(schema.STEPS_TAG, b)
                                                             for b in chunks[schema.STEPS_TAG]]))
    np.testing.assert_array_equal(run.gaps, np.concatenate([packing.decode(schema.GAPS_TAG, b)
                                                            for b in chunks[schema.GAPS_TAG]]))
    np.testing.assert_allclose(run.steps[:, 2:4], rows[:, 2:4], atol=1.5e-6, rtol=0)


def _read_cpu_s(logdir: str, run: str, repeats: int = 3) -> tuple[float, object]:
    """The least CPU time of `repeats` reads of `run` (unlike wall time, steady on a loaded machine), and the run."""
    best = float("inf")
    for _ in range(repeats):
        cpu_s = time.process_time()
        data = read_logdir(logdir)[run]
        best = min(best, time.process_time() - cpu_s)
    return best, data


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["copy", "second_writer"])
def test_overlapping_event_files_read_in_linear_time_each_step_once(tmp_path, overlap):
    # Two files over the same span of one run: a copy of the file, or a second writer from before rnnmon's writer
    # lock. Each chunk that landed before rows already read used to rebuild the whole table: 8/16/32k steps took
    # 1.1/4.1/17.2 s, and a copy counted every step twice.
    for steps in (8_000, 16_000):
        alone, both = tmp_path / f"alone{steps}", tmp_path / f"both{steps}"
        if overlap == "copy":
            write_gpu_run(str(both / "rnnmon"), steps // 20, steps_per_chunk=20)
            alone_s, one = _read_cpu_s(str(both), "rnnmon")
            path = _one_file(both / "rnnmon")
            shutil.copyfile(path, path + ".copy")
        else:
            write_writers(str(alone / "rnnmon"), 1, steps, 5)
            write_writers(str(both / "rnnmon"), 2, steps // 2, 5)  # the same steps and chunks in all
            alone_s, one = _read_cpu_s(str(alone), "rnnmon")
        both_s, two = _read_cpu_s(str(both), "rnnmon")
        assert len(one.steps) == len(two.steps) == steps and two.errors == []
        assert both_s < 3 * alone_s + 0.01, (steps, both_s, alone_s)  # linear: one file takes ~0.05 s
        assert one.notes == [] and len(two.notes) == 1
        assert ("a copy of the file" if overlap == "copy" else "two writers of one run") in two.notes[0]
        if overlap == "copy":
            assert np.all(np.diff(two.steps[:, 2]) > 0)  # each step once, in time order


def test_chunks_that_arrive_late_are_merged_in_order(tmp_path):
    # A writer that flushes a chunk after another writer's later chunks were read: merged, not appended.
    run_dir = str(tmp_path / "rnnmon")
    rng = np.random.default_rng(7)
    writers, reader = [SummaryWriter(run_dir) for _ in range(3)], RunReader("rnnmon")
    views = []  # tables handed out earlier: a merge must not move the rows under them
    for i in range(60):
        writer = writers[int(rng.integers(3))]
        writer.table(schema.STEPS_TAG, _steps(int(rng.integers(1, 30)), seed=i))
        time.sleep(0.002)  # chunks are stamped in milliseconds
        if rng.random() < 0.4:
            writers[int(rng.integers(3))].flush()
        if rng.random() < 0.3:
            steps = reader.update_from_files(run_dir).steps
            views.append((steps, steps.copy()))
    for writer in writers:
        writer.close()
    data = reader.update_from_files(run_dir)
    chunks = sorted((event.step, packing.decode(schema.STEPS_TAG, value.tensor.string_val[0]))
                    for name in sorted(os.listdir(run_dir)) if "tfevents" in name
                    for event in map(event_pb2.Event.FromString, scan_records(os.path.join(run_dir, name)).records)
                    for value in event.summary.value if value.tag == schema.STEPS_TAG)
    assert reader.reordered > 0  # some chunk did arrive late
    for view, seen in views:
        np.testing.assert_array_equal(view, seen)
    np.testing.assert_array_equal(data.steps, np.concatenate([rows for _, rows in chunks]))
    np.testing.assert_array_equal(read_logdir(str(tmp_path))["rnnmon"].steps, data.steps)


def test_a_reader_of_some_tags_and_tag_prefixes_reads_those_alone(tmp_path):
    # The tab's /workers reads a worker's steps, phases, description and every GPU's samples, and no other table.
    run_dir = str(tmp_path / "run" / "rnnmon")
    write_gpu_run(run_dir, 3, gpus=2)
    provider, ctx = open_logdir(str(tmp_path))
    tags = frozenset({schema.RUN_TAG, schema.STEPS_TAG, schema.PHASES_TAG})
    whole = RunReader("run/rnnmon").update_from_files(run_dir)
    for data in (RunReader("run/rnnmon", tags, (schema.UTIL_TAG_PREFIX,)).update_from_files(run_dir),
                 RunReader("run/rnnmon", tags, (schema.UTIL_TAG_PREFIX,)).update_from_provider(provider, ctx)):
        assert not data.errors and data.info == whole.info and len(data.gaps) == 0 and not data.stats
        np.testing.assert_array_equal(data.steps, whole.steps)
        np.testing.assert_array_equal(data.phases, whole.phases)
        assert set(data.util) == {0, 1} and all(np.array_equal(data.util[i], whole.util[i]) for i in (0, 1))
