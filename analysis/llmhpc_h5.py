"""The one reader of llmhpc's per-rank HDF5 files; every analysis script goes through it.

It mirrors docs/hdf5-schema.md: a run directory holds rank00000.h5, rank00001.h5, ...; each
file has root attributes (who wrote it, how, schema_version, status) and one group per
measured configuration ("record") with a `status` attribute, the configuration as
attributes and raw per-iteration arrays as 1-D datasets. Records live under a group named
after their kind ("bench/<label>"), or are that group themselves ("train").

    from llmhpc_h5 import open_run
    run = open_run("results/bench-20261122-103000")
    run.world_size, run.mode, run.attrs            # root attributes (of rank 0's file)
    run.records("bench", rank=0)                   # [Record]: .name .status .attrs .arrays
    run.bench_summary(rank=0)                      # DataFrame: one row per configuration
    run.bench_summary(rank=None)                   # pooled over all ranks
    run.ddp_summary()                              # mode ddp: one row per configuration, ranks pooled
    run.train_steps(rank=0)                        # DataFrame: step, loss, times
    run.profile_activities("tiny_T32_B2_fp32_naive")   # mode profile: one row per kernel/op, names resolved
    run.profile_ranges("tiny_T32_B2_fp32_naive")       # mode profile: one row per phase range

Opening a run reads attributes and dataset names only. Record.arrays reads a dataset the first
time it is indexed (`rec.arrays["step_ms"]`) and keeps it; for streamed records of millions of
rows, `rec.arrays.read(name, start, stop)` reads a slice and `rec.arrays.iter_chunks(names)`
walks the rows in batches, keeping nothing.

A file written by a newer llmhpc (a schema_version this module does not know) is refused
with a message, rather than misread. Units are in the names (_ms, _us, _ns, _s, _bytes, _mb:
MiB; algbw and busbw GB/s), of datasets and attributes alike: docs/hdf5-schema.md.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import glob
import json
import math
import os
import re
import sys

import h5py
import numpy as np
import pandas as pd

# schema_version values this module can read. Bump together with docs/hdf5-schema.md.
KNOWN_SCHEMA_VERSIONS = (1,)
# Root attributes every rank file carries (docs/hdf5-schema.md, "Root attributes"; run_id and end_time may be absent).
REQUIRED_ROOT_ATTRIBUTES = ("schema_version", "mode", "rank", "world_size", "local_rank", "hostname", "device_name",
                            "backend", "git_sha", "argv", "config_json", "start_time", "status")
RANK_FILE_PATTERN = re.compile(r"^rank(\d{5,})\.h5$")
# Rows per batch of Arrays.iter_chunks: 16 chunks of a stream's datasets (docs/hdf5-schema.md).
CHUNK_ROWS = 1 << 20
# Per-step arrays of a bench record, in the order a step runs them; "step" is the whole step.
BENCH_PHASES = ("forward", "backward", "optimizer", "step")
# Attributes that identify one bench configuration (the rest describe the run or its result).
BENCH_CONFIG_KEYS = ("model", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length",
                     "batch_size", "precision", "grad_dtype", "attention", "phase", "separate_optimizer", "cuda_graph",
                     "warmup", "steps")
# Per-step arrays of a ddp record; "comm" is the communication backward did not hide.
# comm_busy: the device time of the data-parallel collectives (nccl only: NaN from the mpi backend).
# tp_comm: what the layers waited for the tensor-parallel group's collectives, inside forward and
# backward (NaN without --tp).
DDP_PHASES = ("forward", "backward", "comm", "optimizer", "param_comm", "step", "comm_busy", "tp_comm")
# Attributes that identify one ddp configuration (batch_size is the global batch).
DDP_CONFIG_KEYS = ("model", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length",
                   "batch_size", "local_batch_size", "world_size", "precision", "grad_dtype", "attention", "low_memory",
                   "ddp",
                   "bucket_mb", "shard_optimizer", "backend", "warmup", "steps")
# Results of a ddp configuration that are the same on every rank (taken from the first rank that has them).
DDP_RESULT_KEYS = ("num_params", "buckets", "collectives_per_step", "comm_bytes_per_step",
                   "collectives_issued_after_backward", "tp_collectives_per_step", "tp_bus_bytes_per_step",
                   "part_params", "param_collectives_per_step", "param_comm_bytes_per_step", "comm_bus_bytes_per_step")
# Memory at the reference DDP study's three points, per rank; the summary shows the largest over ranks.
DDP_MEMORY_KEYS = ("memory_after_init_bytes", "memory_before_optimizer_bytes", "memory_after_optimizer_bytes",
                   "peak_memory_bytes", "memory_after_optimizer_optimizer_bytes")
MIB, GIB = float(1 << 20), float(1 << 30)


def grad_dtype(attrs) -> str:
    """What backward wrote the gradients in (--grad-dtype); files from before it: the master weights' dtype."""
    return attrs.get("grad_dtype") or ("fp64" if attrs.get("precision") == "fp64" else "fp32")


def label_precision(attrs) -> str:
    """The precision as tables name it: "bf16 bf16-grads" for bf16 with gradients made in bf16, so
    that it stands beside plain bf16 rather than in its place."""
    return attrs["precision"] + (" bf16-grads" if grad_dtype(attrs) == "bf16" else "")


def model_name(attrs) -> str:
    """The model as tables name it: its preset (`small`), else its shape as record labels write it
    (`d64_ff128_L2_H4`: a custom shape, or one taken from a checkpoint)."""
    if attrs.get("model") not in (None, "custom", "checkpoint"):
        return attrs["model"]
    return f"d{attrs['d_model']}_ff{attrs['d_ff']}_L{attrs['num_layers']}_H{attrs['num_heads']}"


def on_cpu(attrs) -> bool:
    """True for a run of the CPU backend (root attributes: device_name is `cpu (N threads)` there)."""
    return str(attrs.get("device_name", "")).startswith("cpu")


# Values that sweeps list in an order of their own: the fp32 reference first, naive before flash,
# the phases as a step runs them. Others sort numerically, or by name.
VALUE_ORDER = {"precision": ("fp32", "bf16", "bf16 bf16-grads", "fp64"), "attention": ("naive", "flash"),
               "phase": ("forward", "forward-backward", "train-step")}


def sweep_key(row, keys) -> tuple:
    """Sort key of a row (a dict or a pandas row) by `keys` in sweep order: VALUE_ORDER's values in
    its order (then any others by name), numbers numerically (128 after 32), missing values last."""
    out = []
    for key in keys:
        value, order = row.get(key), VALUE_ORDER.get(key, ())
        if value in order:
            out.append((0, order.index(value), ""))
        elif isinstance(value, (int, float, np.number)) and not math.isnan(value):
            out.append((1, float(value), ""))
        elif value is None or isinstance(value, float):  # None or NaN
            out.append((3, 0.0, ""))
        else:
            out.append((2, 0.0, str(value)))
    return tuple(out)


def status_word(status) -> str:
    """A record's status in one word, as tables print it: 'ok', 'oom', 'error: ...' -> 'error',
    'interrupted (3 of 10 steps kept)' -> 'interrupted'."""
    return str(status).split(":")[0].split(" (")[0]


def unit_of(sizes) -> tuple:
    """(unit, bytes per unit) for a table of these sizes in bytes: GiB, or MiB where all are below
    1 GiB (a small model's 3 MiB and 2.5 MiB would both print 0.00 GiB)."""
    return ("GiB", GIB) if max(sizes, default=0) >= GIB else ("MiB", MIB)


def peak_cell(status: str, peak, scale: float, decimals: int) -> str:
    """A configuration's peak memory `peak` in units of `scale` (MIB for a peak in bytes); one that
    failed had reached it when it stopped, so it is a lower bound, marked with the status:
    'oom (>7.61)'; the status alone where it never started (no peak)."""
    word = status_word(status)
    value = f"{peak / scale:.{decimals}f}" if peak and peak > 0 else ""
    if word == "ok":
        return value or "-"
    return f"{word} (>{value})" if value else word


# Mode profile: the activity kinds (the `kind` column of /profile_kernels/<label>) and the categories,
# in the order of kernels/profiler.h.
PROFILE_KINDS = ("kernel", "memcpy", "memset", "op")
PROFILE_CATEGORIES = ("matmul", "attention", "norm", "elementwise", "optimizer", "memcpy", "communication", "other")


class SchemaError(Exception):
    """The directory or a file in it is not what docs/hdf5-schema.md describes."""


def parse_config_json(text: str) -> dict:
    """The root attribute config_json as a dict (option name -> value, defaults included)."""
    return json.loads(text)


def _add_stats(row: dict, prefix: str, parts: list) -> None:
    """row[prefix_n], row[prefix_mean], row[prefix_std] (sample std, n-1; 0 for one sample),
    row[prefix_min] and row[prefix_max] of the samples in the arrays `parts` pooled; NaN (and n 0)
    when there are none."""
    values = np.concatenate([np.asarray(p, dtype=float) for p in parts]) if parts else np.array([])
    row[f"{prefix}_n"] = len(values)
    row[f"{prefix}_mean"] = float(values.mean()) if len(values) else math.nan
    row[f"{prefix}_std"] = float(values.std(ddof=1)) if len(values) > 1 else (0.0 if len(values) else math.nan)
    row[f"{prefix}_min"] = float(values.min()) if len(values) else math.nan
    row[f"{prefix}_max"] = float(values.max()) if len(values) else math.nan


def slowest_of_ranks(times: list) -> np.ndarray:
    """The slowest rank's time of each step (or iteration) from every rank's own times (a non-empty
    list, one array per rank), over the steps every rank has: a configuration cut short keeps each
    rank's own count."""
    n = min(len(t) for t in times)
    return np.max(np.stack([np.asarray(t[:n], dtype=float) for t in times]), axis=0)


def _sensor_summary(recs) -> dict:
    """The device sensors' summary attributes of one configuration's records, over the ranks."""
    def lowest(key):
        values = [float(r.attrs[key]) for r in recs if key in r.attrs]
        return min(values) if values else math.nan
    seen = [str(r.attrs["device_slowdowns"]) for r in recs if "device_slowdowns" in r.attrs]
    reasons = sorted({name for text in seen if text != "none" for name in text.split(", ")})
    return {"sm_clock_mhz_min": lowest("device_sm_clock_mhz_min"),
            "sm_clock_mhz_median": lowest("device_sm_clock_mhz_median"),
            "slowdowns": ", ".join(reasons) if reasons else ("none" if seen else "")}


# What a mode's records count their timed steps in, as its progress lines say: steps elsewhere.
STEP_UNITS = {"attention": "iterations", "comm": "iterations"}


def pooled_status(records: list) -> str:
    """'ok' when every record is ok, else the other statuses joined; records that kept their steps
    (Record.kept_steps) say how many over the ranks, in their mode's unit (STEP_UNITS):
    'interrupted: SIGTERM (4866-4870 of 1000000 steps kept)'."""
    statuses = sorted({r.status for r in records})
    if statuses == ["ok"]:
        return "ok"
    out = []
    for status in statuses:
        if status == "ok":
            continue
        kept = [r for r in records if r.status == status and r.kept_steps]
        if kept:
            counts = sorted(int(r.attrs["steps_timed"]) for r in kept)
            span = str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
            unit = STEP_UNITS.get(kept[0].kind, "steps")
            status += f" ({span} of {int(kept[0].attrs.get('steps_asked', 0))} {unit} kept)"
        out.append(status)
    return "; ".join(out)


def _plain(value):
    """h5py attribute values as plain Python values (str, int, float, lists)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.dtype.kind in "OS" else value.tolist()
    return value


def _read_dataset(ds: h5py.Dataset, selection=()) -> np.ndarray:
    """`selection` of `ds` (all of it by default); strings as an object array of str."""
    if h5py.check_string_dtype(ds.dtype) is not None:
        return np.array(ds.asstr()[selection], dtype=object)
    return ds[selection]


class Arrays(collections.abc.Mapping):
    """A record's datasets by name, read from its file only when asked for.

    Used like the dict of numpy arrays it stands for (`arrays["step_ms"]`, `in`, `keys()`,
    `get()`, iteration), it holds only the file's path, the group's path and the dataset
    names. Indexing reads the whole dataset the first time and keeps it. `read` (a slice)
    and `iter_chunks` (every row, a batch at a time) read without keeping, for streams too
    large to hold. Each access opens the file and closes it again, so nothing stays open
    between accesses and the writer of a running job is not disturbed.

    A streamed record's datasets are cut at its `stream_rows` attribute: the rows its last
    finished batch committed (a crash in the middle of a batch can leave more in some).
    """

    def __init__(self, file_path: str, group_path: str, names, rows: int | None = None):
        self.file_path = file_path
        self.group_path = group_path
        self._names = tuple(names)
        self._rows = rows      # stream_rows of a streamed record, None for a plain one
        self._loaded = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._loaded:
            self._check_names([name])
            with self._open() as f:
                ds = self._dataset(f, name)
                self._loaded[name] = _read_dataset(ds, () if self._rows is None else slice(0, self._length(ds)))
        return self._loaded[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return name in self._names

    def __repr__(self) -> str:
        return f"Arrays({self.file_path}:/{self.group_path}, {list(self._names)})"

    def length(self, name: str) -> int:
        """Rows of the 1-D dataset `name`, without reading it."""
        self._check_names([name])
        with self._open() as f:
            return self._length(self._dataset(f, name))

    def read(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """Rows start..stop-1 of the 1-D dataset `name` (Python slice rules), read now and not kept."""
        self._check_names([name])
        with self._open() as f:
            ds = self._dataset(f, name)
            start, stop, _ = slice(start, stop).indices(self._length(ds))
            return _read_dataset(ds, slice(start, max(start, stop)))

    def iter_chunks(self, names=None, rows: int = CHUNK_ROWS):
        """Yields {name: array} for consecutive ranges of at most `rows` rows of the 1-D datasets
        `names` (all of them by default), which must have equal lengths, as a stream's columns do.
        The file stays open while the iteration runs; nothing is kept."""
        names = list(self._names if names is None else names)
        self._check_names(names)
        if rows < 1:
            raise ValueError(f"iter_chunks: rows must be at least 1, not {rows}")
        with self._open() as f:
            datasets = [self._dataset(f, n) for n in names]
            lengths = {n: self._length(ds) for n, ds in zip(names, datasets)}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"{self.file_path}:/{self.group_path}: iter_chunks needs datasets of one length, "
                                 f"these have {lengths}")
            total = next(iter(lengths.values()), 0)
            for start in range(0, total, rows):
                selection = slice(start, min(start + rows, total))
                yield {n: _read_dataset(ds, selection) for n, ds in zip(names, datasets)}

    def _check_names(self, names):
        for name in names:
            if name not in self._names:
                raise KeyError(f"{name!r}: not a dataset of {self.file_path}:/{self.group_path} "
                               f"(it has {list(self._names)})")

    def _open(self) -> h5py.File:
        try:
            return h5py.File(self.file_path, "r")
        except OSError as e:
            raise SchemaError(f"{self.file_path}: cannot be opened as HDF5 ({one_line(e)})") from None

    def _dataset(self, f: h5py.File, name: str) -> h5py.Dataset:
        ds = f.get(f"{self.group_path}/{name}")
        if not isinstance(ds, h5py.Dataset):
            raise SchemaError(f"{self.file_path}: dataset /{self.group_path}/{name} is gone (the file was changed "
                              f"after it was opened)")
        return ds

    def _length(self, ds: h5py.Dataset) -> int:
        if ds.ndim != 1:
            raise SchemaError(f"{self.file_path}:{ds.name} has shape {ds.shape}; only 1-D datasets have rows")
        return ds.shape[0] if self._rows is None else min(self._rows, ds.shape[0])


@dataclasses.dataclass
class Record:
    """One measured configuration: the group at `path` in one rank's file."""
    rank: int
    path: str                 # e.g. "bench/small_T128_B4_fp32_naive" or "train"
    status: str               # "ok", "oom", "error: ...", "running" (in progress, read with live=True),
                              # "interrupted" (the run ended while it was measured, or a stream not closed),
                              # "aborted by the watchdog" (this rank's watchdog ended the run while it was
                              # measured; the stuck collective is in the file's own status, RankFile.status)
    attrs: dict               # configuration and results as attributes, `status` excluded
    arrays: Arrays            # name -> numpy array (raw per-iteration values), read on first access

    @property
    def kind(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.path.split("/")[-1]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def kept_steps(self) -> bool:
        """Cut short with the steps it had measured: status 'interrupted' (a signal, or a kill after a
        --flush-s rewrite) or ABORTED (the watchdog ended the run), and steps_timed > 0
        (docs/hdf5-schema.md, "Records"). Summaries count its steps, and say so in the status."""
        return self.status.startswith(("interrupted", ABORTED)) and int(self.attrs.get("steps_timed", 0)) > 0

    @property
    def measured(self) -> bool:
        """Its steps are there to summarize: ok, or cut short with the steps it kept."""
        return self.ok or self.kept_steps


ABORTED = "aborted by the watchdog"  # a rank file's status when its watchdog ended the job


def rank_list(ranges: str) -> list:
    """[0, 2, 3, 4, 5, 9] from the watchdog's rank ranges '0,2-5,9' ('' for none)."""
    out = []
    for part in filter(None, ranges.split(",")):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


@dataclasses.dataclass
class RankFile:
    """One rank's file: its root attributes and every record in it."""
    path: str
    attrs: dict
    records: list

    @property
    def rank(self) -> int:
        return int(self.attrs["rank"])

    @property
    def status(self) -> str:
        """'complete' when the run ended normally; 'running' if it was cut short (crash, kill); 'error: ...',
        'interrupted: ...' (a signal, its state saved) or 'aborted by the watchdog: ...' (Run.hang_reports)."""
        return self.attrs["status"]


def read_rank_file(path: str, live: bool = False) -> RankFile:
    """Reads one rank file's attributes and dataset names and closes it; arrays are read when accessed.

    llmhpc marks a configuration "running" before measuring it and replaces the mark when it is
    done, so a record still "running" in a run that has ended is the one a killed rank was
    measuring: it is read as "interrupted", or as ABORTED where the watchdog ended the run (live=True
    keeps "running", for a run still going)."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise SchemaError(f"{path}: cannot be opened as HDF5 ({one_line(e)})") from None
    with f:
        attrs = {key: _plain(value) for key, value in f.attrs.items()}
        if "schema_version" not in attrs:
            raise SchemaError(f"{path}: no root attribute 'schema_version'; not an llmhpc rank file")
        version = attrs["schema_version"]
        if version not in KNOWN_SCHEMA_VERSIONS:
            raise SchemaError(f"{path}: schema_version {version} is not known to analysis/llmhpc_h5.py (it reads "
                              f"{', '.join(map(str, KNOWN_SCHEMA_VERSIONS))}); the file was written by a different "
                              f"llmhpc: update the analysis scripts to the one that wrote it")
        missing = [key for key in REQUIRED_ROOT_ATTRIBUTES if key not in attrs]
        if missing:
            raise SchemaError(f"{path}: root attributes {missing} are missing (schema_version {version})")
        rank = int(attrs["rank"])
        records = []

        def visit(name, obj):
            # A record is any group that carries a status; its parents are only containers.
            if isinstance(obj, h5py.Group) and "status" in obj.attrs:
                group_attrs = {k: _plain(v) for k, v in obj.attrs.items()}
                status = group_attrs.pop("status")
                if status == "running" and not live:  # what the run was measuring when it ended
                    status = ABORTED if str(attrs.get("status", "")).startswith(ABORTED) else "interrupted"
                names = [k for k in obj if obj.get(k, getclass=True) is h5py.Dataset]
                rows = group_attrs.get("stream_rows")
                arrays = Arrays(os.path.abspath(path), name, names, None if rows is None else int(rows))
                records.append(Record(rank=rank, path=name, status=status, attrs=group_attrs, arrays=arrays))

        f.visititems(visit)
    return RankFile(path=path, attrs=attrs, records=records)


class Run:
    """All rank files of one run directory."""

    def __init__(self, directory: str, files: list):
        self.directory = directory
        self.files = sorted(files, key=lambda rf: rf.rank)

    # ---- who and how ----
    @property
    def attrs(self) -> dict:
        """Root attributes of the lowest rank's file (rank 0 whenever it is there)."""
        return self.files[0].attrs

    @property
    def config(self) -> dict:
        """The run's options (config_json): every option, defaults included, by its CLI name."""
        return parse_config_json(self.attrs["config_json"])

    @property
    def mode(self) -> str:
        return self.attrs["mode"]

    @property
    def world_size(self) -> int:
        return int(self.attrs["world_size"])

    @property
    def ranks(self) -> list:
        return [rf.rank for rf in self.files]

    @property
    def missing_ranks(self) -> list:
        """Ranks of the run with no file in the directory."""
        return sorted(set(range(self.world_size)) - set(self.ranks))

    @property
    def finished(self) -> bool:
        """True when every rank file there is says the run ended normally."""
        return all(rf.status == "complete" for rf in self.files)

    @property
    def complete(self) -> bool:
        """True when every rank's file is there and says the run ended normally."""
        return self.finished and not self.missing_ranks

    def nodes(self) -> list:
        """[(hostname, [ranks])] in node order: by the node_index every rank file records (the order of
        MPI's shared-memory split), or by hostname in files that predate it."""
        groups = {}
        for rf in sorted(self.files, key=lambda f: f.rank):
            key = (int(rf.attrs["node_index"]) if "node_index" in rf.attrs else -1, str(rf.attrs["hostname"]))
            groups.setdefault(key, []).append(rf.rank)
        return [(host, ranks) for (_, host), ranks in sorted(groups.items())]

    def _distinct(self, key) -> str:
        """Each comma-separated value of attribute `key` once over the rank files, in rank order."""
        seen = []
        for rf in sorted(self.files, key=lambda f: f.rank):
            for value in str(rf.attrs.get(key, "")).split(","):
                if value and value not in seen:
                    seen.append(value)
        return ",".join(seen)

    def nccl_connections(self) -> str:
        """How NCCL said it connected the ranks, from the rank files' nccl_transports, nccl_network and
        nccl_interfaces (each value once over the ranks): 'P2P/CUMEM/read; network Socket on eth0';
        '' where no file has them (no NCCL, or NCCL_DEBUG set by the user: docs/hdf5-schema.md)."""
        transports, network, interfaces = (self._distinct(k) for k in ("nccl_transports", "nccl_network", "nccl_interfaces"))
        parts = [transports] if transports else []
        if network:
            parts.append(f"network {network}" + (f" on {interfaces}" if interfaces else ""))
        return "; ".join(parts)

    def mpi_connections(self) -> str:
        """How MPI reached the ranks' peers, from the rank files' mpi_transports and mpi_interfaces
        (each value once over the ranks): 'shared memory,tcp on eth0'; '' where no file has them
        (one rank, NCCL started, or a file from before they were: docs/hdf5-schema.md)."""
        transports, interfaces = self._distinct("mpi_transports"), self._distinct("mpi_interfaces")
        return transports + (f" on {interfaces}" if transports and interfaces else "")

    def hang_reports(self) -> list:
        """What each rank's watchdog found when it ended the job, from the rank files whose status
        begins 'aborted by the watchdog' (docs/hdf5-schema.md, "Hangs"): one dict per such rank,
        in rank order, with rank, host, what (the stuck collective), collective (its number),
        reached, not_reached and no_answer (rank ranges, '0,2-5', '' for none), not_reached_hosts
        and no_answer_hosts (comma-separated), mismatched (the ranks that issued the collective's
        number as another collective), group (the ranks it runs among, '' for every rank) and
        waited_for (those of them that had not issued it or gave no answer), late_s (how long the
        rank's watchdog had not run before it fired: stopped or starved, its report made after the
        others'; 0 on time), fired_on (the rank whose watchdog fired: this one's own, or where this
        rank had not issued the collective and was inside none, the firing rank it learnt it from),
        report (as printed); [] where no watchdog fired."""
        out = []
        for rf in sorted(self.files, key=lambda f: f.rank):
            if not str(rf.status).startswith(ABORTED):
                continue
            a = rf.attrs
            out.append(dict(rank=rf.rank, host=str(a.get("hostname", "")), what=str(rf.status)[len(ABORTED):].lstrip(": "),
                            collective=int(a.get("hang_collective", 0)), reached=str(a.get("hang_reached", "")),
                            not_reached=str(a.get("hang_not_reached", "")),
                            not_reached_hosts=str(a.get("hang_not_reached_hosts", "")),
                            no_answer=str(a.get("hang_no_answer", "")),
                            no_answer_hosts=str(a.get("hang_no_answer_hosts", "")),
                            mismatched=str(a.get("hang_mismatched", "")), group=str(a.get("hang_group", "")),
                            waited_for=str(a.get("hang_waited_for", "")), late_s=float(a.get("hang_late_s", 0.0)),
                            fired_on=int(a.get("hang_fired_on_rank", rf.rank)),
                            report=str(a.get("hang_report", ""))))
        return out

    def describe_ranks(self) -> str:
        """'2 rank(s)', or '2 rank(s), rank 1's file missing' where a rank has none; on several nodes, the
        ranks of each: '4 rank(s) on 2 nodes: node0 (ranks 0-1), node1 (ranks 2-3)'; then how NCCL
        connected them, or else how MPI did, where the files say (nccl_connections, mpi_connections)."""
        missing = self.missing_ranks
        text = f"{self.world_size} rank(s)"
        nodes = self.nodes()
        if len(nodes) > 1:
            def span(ranks):
                return f"rank {ranks[0]}" if len(ranks) == 1 else (
                    f"ranks {ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1))
                    else "ranks " + ",".join(map(str, ranks)))
            text += f" on {len(nodes)} nodes: " + ", ".join(f"{host} ({span(r)})" for host, r in nodes)
        nccl, mpi = self.nccl_connections(), self.mpi_connections()
        if nccl:
            text += f"; NCCL: {nccl}"
        elif mpi:
            text += f"; MPI: {mpi}"
        if not missing:
            return text
        which = f"rank {missing[0]}'s file" if len(missing) == 1 else f"ranks {missing}' files"
        return f"{text}, {which} missing"

    def rank_file(self, rank: int) -> RankFile:
        for rf in self.files:
            if rf.rank == rank:
                return rf
        raise SchemaError(f"{self.directory}: no file for rank {rank} (ranks present: {self.ranks})")

    # ---- records ----
    def records(self, kind: str | None = None, rank: int | None = 0) -> list:
        """Records of one kind ("bench", "train", ...) of one rank, or of every rank with rank=None."""
        files = self.files if rank is None else [self.rank_file(rank)]
        return [r for rf in files for r in rf.records if kind is None or r.kind == kind]

    def records_by_name(self, kind: str, rank: int | None = None) -> dict:
        """{record name: [that configuration's record on each rank asked for]} (rank=None: every rank)."""
        groups = {}
        for r in self.records(kind, rank):
            groups.setdefault(r.name, []).append(r)
        return groups

    def records_frame(self, kind: str | None = None, rank: int | None = 0) -> pd.DataFrame:
        """One row per record: rank, path, name, status and every attribute."""
        rows = [dict(rank=r.rank, path=r.path, name=r.name, status=r.status, **r.attrs)
                for r in self.records(kind, rank)]
        return pd.DataFrame(rows)

    # ---- bench ----
    def bench_samples(self, rank: int | None = 0, warmup: bool = False) -> pd.DataFrame:
        """Long form of every timed (or, with warmup=True, warm-up) step: rank, name, phase, step, ms."""
        prefix = "warmup_" if warmup else ""
        rows = []
        for r in self.records("bench", rank):
            for phase in BENCH_PHASES:
                for i, value in enumerate(r.arrays.get(f"{prefix}{phase}_ms", [])):
                    rows.append(dict(rank=r.rank, name=r.name, phase=phase, step=i, ms=float(value)))
        return pd.DataFrame(rows, columns=["rank", "name", "phase", "step", "ms"])

    def bench_summary(self, rank: int | None = 0) -> pd.DataFrame:
        """One row per bench configuration, by label (the files' order; sweep_key gives the sweep's).

        Columns: the configuration attributes, status, ranks (how many ranks' samples were
        pooled), and for each phase in BENCH_PHASES <phase>_mean, <phase>_std (sample standard
        deviation, n-1; 0 for one sample), <phase>_min, <phase>_max and <phase>_n, in ms; NaN
        where the phase was not timed or the configuration did not run (status oom/error); a
        configuration cut short counts the steps it kept (Record.kept_steps; its status says how
        many). With rank=None the samples of all ranks are pooled; the status is 'ok' only if it
        is 'ok' on every rank.
        From the device sensors (docs/hdf5-schema.md), where the records have them:
        sm_clock_mhz_min and sm_clock_mhz_median (the lowest over the ranks' busy readings, and
        the lowest rank's median; NaN without readings) and slowdowns (the reasons any rank saw,
        'none', or '' without readings).
        """
        rows = []
        for name, recs in self.records_by_name("bench", rank).items():
            first = recs[0]
            row = {key: first.attrs.get(key) for key in BENCH_CONFIG_KEYS}
            row["cuda_graph"] = row["cuda_graph"] or 0  # files from before --cuda-graph existed
            row["grad_dtype"] = grad_dtype(first.attrs)
            row["name"] = name
            row["status"] = pooled_status(recs)
            row["ranks"] = len(recs)
            row["num_params"] = first.attrs.get("num_params")
            row["peak_memory_bytes"] = max(r.attrs.get("peak_memory_bytes", 0) for r in recs)
            for phase in BENCH_PHASES:
                _add_stats(row, phase, [r.arrays[f"{phase}_ms"] for r in recs
                                        if r.measured and f"{phase}_ms" in r.arrays])
            row.update(_sensor_summary(recs))
            rows.append(row)
        return pd.DataFrame(rows)

    # ---- ddp ----
    def ddp_summary(self, rank: int | None = None) -> pd.DataFrame:
        """One row per ddp configuration (/ddp/<label>), in the files' order (by label; analysis/ddp.py
        orders the strategies).

        Columns: DDP_CONFIG_KEYS (batch_size is the global batch; bucket_mb is 0 for strategies
        other than bucketed), name, status ('ok' only if ok on every rank), ranks (records pooled),
        DDP_RESULT_KEYS and comm_mib_per_step (what one step all-reduces, MiB); for each phase in
        DDP_PHASES <phase>_mean, <phase>_std (n-1) and <phase>_n in ms, the samples of every rank
        pooled (rank=None, the default) or of one rank; comm_pct = 100 x comm_mean / step_mean;
        grad_comm_mean = comm_mean - param_comm_mean, what the gradients' collectives left after
        backward (comm_ms holds param_comm_ms, the wait after the optimizer, which under zero2 is
        the cast of the updated shard for its all-gathers, not communication);
        slowest_step_mean/_std/_n from step_ms_max_over_ranks (the slowest rank's time of each step,
        the same array on every rank, so taken once); DDP_MEMORY_KEYS, the largest over ranks; from the
        device sensors, as bench_summary: sm_clock_mhz_min, sm_clock_mhz_median, slowdowns.
        Times and results are NaN where the configuration did not run (status oom or error); one
        cut short counts the steps it kept (Record.kept_steps), its status says how many, its slowest
        rank's steps are the ranks' maxima over the steps every rank kept (all ranks pooled and every
        one kept some; else NaN), and the results it had not reached (buckets, bytes per step) are NaN.
        """
        rows = []
        for name, recs in self.records_by_name("ddp", rank).items():
            first = recs[0]
            ok = [r for r in recs if r.measured]
            row = {key: first.attrs.get(key) for key in DDP_CONFIG_KEYS}
            row["shard_optimizer"] = row["shard_optimizer"] or "none"  # files from before sharding existed
            row["grad_dtype"] = grad_dtype(first.attrs)
            # What travelled, one label per kind in the tables: the bf16 copy (--share-weights bf16), which
            # only broadcast and zero1 choose; zero2 and zero3 gather bf16 under --precision bf16 anyway.
            if first.attrs.get("share_weights") == "bf16" and row["shard_optimizer"] in ("broadcast", "zero1"):
                row["shard_optimizer"] += " bf16"
            row["collective_engine"] = first.attrs.get("collective_engine", "sm")  # files from before it existed
            # Tensor parallelism (files from before it: none); world_size / tp data-parallel ranks.
            row["tp"] = int(first.attrs.get("tp", 1))
            row["sequence_parallel"] = int(first.attrs.get("sequence_parallel", 0))
            row["tp_overlap"] = int(first.attrs.get("tp_overlap", 1))  # chunks of forward's products
            # What the gradients travelled as (files from before the option: their own dtype).
            row["grad_reduce_dtype"] = first.attrs.get("grad_reduce_dtype", "fp64" if row["precision"] == "fp64" else "fp32")
            row.update(name=name, status=pooled_status(recs), ranks=len(recs))
            for key in DDP_RESULT_KEYS:
                row[key] = next((r.attrs[key] for r in recs if key in r.attrs), math.nan)
            row["comm_mib_per_step"] = row["comm_bytes_per_step"] / MIB
            for phase in DDP_PHASES:
                _add_stats(row, phase, [r.arrays[f"{phase}_ms"] for r in ok if f"{phase}_ms" in r.arrays])
            row["comm_pct"] = 100.0 * row["comm_mean"] / row["step_mean"] if row["step_mean"] > 0 else math.nan
            param = row["param_comm_mean"]
            row["grad_comm_mean"] = row["comm_mean"] - (param if math.isfinite(param) else 0.0)
            slowest = [r.arrays["step_ms_max_over_ranks"] for r in ok if "step_ms_max_over_ranks" in r.arrays]
            steps = [r.arrays["step_ms"] for r in ok if "step_ms" in r.arrays]
            if not slowest and rank is None and len(steps) == len(recs) == self.world_size:
                slowest = [slowest_of_ranks(steps)]
            _add_stats(row, "slowest_step", slowest[:1])
            for key in DDP_MEMORY_KEYS:
                values = [r.attrs[key] for r in recs if key in r.attrs]
                row[key] = max(values) if values else math.nan
            row.update(_sensor_summary(recs))
            rows.append(row)
        return pd.DataFrame(rows)

    # ---- train ----
    def train_record(self, rank: int = 0) -> Record:
        recs = self.records("train", rank)
        if not recs:
            raise SchemaError(f"{self.directory}: rank {rank} has no /train record (mode is '{self.mode}')")
        return recs[0]

    def train_steps(self, rank: int = 0) -> pd.DataFrame:
        """One row per training step: step (from the record's first_step), loss, the step's times in ms, and
        where the run had them its learning rate (lr) and gradient norm (grad_norm). The device sensors'
        readings (device_*) are not per step: Record.arrays has them."""
        r = self.train_record(rank)
        steps = len(r.arrays.get("loss", []))
        frame = pd.DataFrame({k: v for k, v in r.arrays.items()
                              if np.ndim(v) == 1 and len(v) == steps and not k.startswith("device_")})
        frame.insert(0, "step", np.arange(len(frame)) + int(r.attrs.get("first_step", 1)))
        return frame


    # ---- profile ----
    def profile_record(self, name: str, rank: int = 0) -> Record:
        """The record /profile/<name> of `rank` (name: the configuration's label)."""
        recs = [r for r in self.records("profile", rank) if r.name == name]
        if not recs:
            labels = [r.name for r in self.records("profile", rank)]
            raise SchemaError(f"{self.directory}: rank {rank} has no /profile/{name} (it has {labels})")
        return recs[0]

    def profile_activities(self, name: str, rank: int = 0) -> pd.DataFrame:
        """Every activity (kernel, copy, CPU op) of configuration `name`'s window on `rank`, in the order
        they were delivered: the columns of /profile_kernels/<name> (kind, name, phase, range, step, start_ns,
        end_ns, stream, correlation, grid_*, block_*, bytes) with kind, name and phase as text (phase ""
        outside every phase), plus category (of the name, as the profiler classified it) and duration_ns.
        Read a batch of rows at a time; the frame holds them all."""
        rec = self.profile_record(name, rank)
        streams = [r for r in self.records("profile_kernels", rank) if r.name == name]
        if not streams:
            raise SchemaError(f"{self.directory}: rank {rank} has /profile/{name} but no /profile_kernels/{name}")
        parts = [pd.DataFrame(batch) for batch in streams[0].arrays.iter_chunks()]
        frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
            {column: np.zeros(0, dtype=np.int64) for column in streams[0].arrays})
        names = np.asarray(rec.arrays["names"], dtype=object)
        categories = np.asarray(rec.arrays["name_category"], dtype=object)
        paths = np.append(np.asarray(rec.arrays["phase_path"], dtype=object), "")  # index -1: no phase
        ids = frame["name"].to_numpy(dtype=np.int64)
        frame["category"] = categories[ids]
        frame["name"] = names[ids]
        frame["kind"] = np.asarray(PROFILE_KINDS, dtype=object)[frame["kind"].to_numpy(dtype=np.int64)]
        frame["phase"] = paths[frame["phase"].to_numpy(dtype=np.int64)]
        frame["duration_ns"] = frame["end_ns"] - frame["start_ns"]
        return frame

    def profile_ranges(self, name: str, rank: int = 0) -> pd.DataFrame:
        """One row per phase range of configuration `name`'s window on `rank`: phase (its path), parent (a
        range index, -1 at the top), step, host_start_ns, host_end_ns, device_start_ns, device_end_ns (-1 where
        unknown) and device_ms (NaN where unknown)."""
        rec = self.profile_record(name, rank)
        paths = np.asarray(rec.arrays["phase_path"], dtype=object)
        frame = pd.DataFrame({key: rec.arrays[f"range_{key}"] for key in
                              ("phase", "parent", "step", "host_start_ns", "host_end_ns", "device_start_ns",
                               "device_end_ns")})
        frame["phase"] = paths[frame["phase"].to_numpy(dtype=np.int64)] if len(frame) else []
        known = frame["device_start_ns"] >= 0
        frame["device_ms"] = np.where(known, (frame["device_end_ns"] - frame["device_start_ns"]) / 1e6, np.nan)
        return frame


def run_directories(*directories: str, mode: str | None = None) -> list:
    """Every folder at or below each of `directories` that holds rank files (sorted; a job's runs
    can nest: ddp_bucketed.sh puts its all-reduce run inside the ddp run's folder), each once
    however it was reached (a folder given twice, a folder and its parent, a link to it); a
    folder holding none stands for itself (open_run says why). With `mode`, a run found below a
    folder is kept only if it is of that mode (a run given itself is always kept: its script
    says what it is)."""
    found, seen = [], set()
    for directory in directories:
        runs = sorted(root for root, _, files in os.walk(directory) if any(RANK_FILE_PATTERN.match(n) for n in files))
        if mode:
            runs = [r for r in runs if os.path.realpath(r) == os.path.realpath(directory) or _mode_of(r) in (mode, None)]
        for run in runs or [directory]:
            if os.path.realpath(run) not in seen:
                seen.add(os.path.realpath(run))
                found.append(run)
    return found


def _mode_of(directory: str) -> str | None:
    """The mode of the run in `directory` from its first rank file, None where it cannot be read."""
    try:
        name = min(n for n in os.listdir(directory) if RANK_FILE_PATTERN.match(n))
        with h5py.File(os.path.join(directory, name), "r") as f:
            return _plain(f.attrs["mode"])
    except (OSError, KeyError, ValueError):
        return None


def one_line(error: Exception) -> str:
    """An error's message on one line: h5py's span several (errno, file name, then the reason)."""
    return " ".join(str(error).split())


def open_run(directory: str, live: bool = False) -> Run:
    """Reads every rankNNNNN.h5 in `directory`. Raises SchemaError when there is none, when a file
    is not an llmhpc rank file, when its schema_version is unknown, or when the files are of different
    runs (run_id; argv for files without one). Says once on stderr when ranks have no file.
    A run whose ranks were killed reads like any other: its finished configurations as written, the
    one being measured as "interrupted" (live=True: "running", for a run still going), Run.complete
    False. Leftover rankNNNNN.h5.tmp files (a change a kill interrupted) are ignored."""
    if not os.path.isdir(directory):
        raise SchemaError(f"{directory}: not a directory (give the --out directory of an llmhpc run)")
    names = sorted(n for n in os.listdir(directory) if RANK_FILE_PATTERN.match(n))
    if not names:
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "*.h5")))
        hint = f" (it has {others[:5]}, which are not named rankNNNNN.h5)" if others else ""
        raise SchemaError(f"{directory}: no llmhpc rank files (rank00000.h5, ...){hint}")
    files = []
    for n in names:
        rf = read_rank_file(os.path.join(directory, n), live)
        if int(RANK_FILE_PATTERN.match(n).group(1)) != rf.rank:
            raise SchemaError(f"{rf.path}: file name says rank {int(RANK_FILE_PATTERN.match(n).group(1))}, "
                              f"its 'rank' attribute says {rf.rank}")
        files.append(rf)
    run = Run(directory, files)
    # run_id names one run on every rank (files older than it have none: their command lines must agree).
    keys = ("world_size", "mode", "run_id") if all("run_id" in rf.attrs for rf in files) else \
        ("world_size", "mode", "run_id", "argv")
    for key in keys:
        values = {str(rf.attrs.get(key, "(none)")) for rf in files}
        if len(values) != 1:
            shown = ", ".join(f"rank {rf.rank}: {rf.attrs.get(key, '(none)')!r}" for rf in files)
            raise SchemaError(f"{directory}: the rank files are of different runs: they disagree on {key} ({shown}); "
                              "keep each run's files in a folder of their own")
    if run.missing_ranks and directory not in _said_missing:
        _said_missing.add(directory)  # once per folder, however often it is opened
        print(f"llmhpc_h5: {directory}: world_size is {run.world_size} but rank(s) {run.missing_ranks} have no file: "
              f"the tables hold rank(s) {run.ranks} only", file=sys.stderr)
    return run


_said_missing = set()


def read_json_lines(path: str, required: tuple, what: str) -> list:
    """The records of a JSON lines file given on a command line (a PyTorch baseline's, ...), each
    with the keys `required`; SchemaError naming the file (and line) where it cannot be."""
    records = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    r = json.loads(line)
                    missing = [k for k in required if not isinstance(r, dict) or k not in r]
                    if missing:
                        raise SchemaError(f"{path}:{number}: not {what} (no {missing})")
                    records.append(r)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SchemaError(f"{path}: cannot be read as JSON lines ({e})") from None
    return records


def repeated_across_runs(frame: pd.DataFrame, keys: list) -> bool:
    """True when a configuration (the values of `keys`) was measured by more than one run of
    frame's `run` column: tables then tell the runs apart instead of showing one of them."""
    if "run" not in frame or frame.empty:
        return False
    return bool((frame.groupby(list(keys), dropna=False)["run"].nunique() > 1).any())


if __name__ == "__main__":  # a module the scripts import, not a script
    print("analysis/llmhpc_h5.py is a module of analysis/, imported by its scripts (python3 analysis/report.py DIR... makes "
          "the report)", file=sys.stderr)
    sys.exit(2)
