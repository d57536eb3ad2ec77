"""Read tracker output back with each tracker's own library; run in the trackers venv, prints JSON.

    python readers.py tensorboard DIR      event files under DIR: scalars (tag -> [[step, value]]), text tags, hparams
    python readers.py mlflow URI           every experiment's runs: params, metric histories (key -> [[step, value]])
    python readers.py wandb DIR            offline runs under DIR/wandb: run id, project, config, history rows
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path


def tensorboard(directory: str) -> dict:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    files = sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("events.out.tfevents.*"))
    runs = sorted({str(Path(f).parent) for f in files})
    out: dict = {"files": files, "runs": {}}
    for run in runs:
        acc = event_accumulator.EventAccumulator(str(Path(directory, run)), size_guidance={
            event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
        acc.Reload()
        scalars = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
        hparams: dict = {}
        for tag, content in acc.PluginTagToContent("hparams").items():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                for name, value in data.session_start_info.hparams.items():
                    kind = value.WhichOneof("kind")
                    hparams[name] = getattr(value, kind)
        text = {tag: [e.step for e in acc.Tensors(tag)] for tag in acc.PluginTagToContent("text")}
        out["runs"][run] = {"scalars": scalars, "hparams": hparams, "text": text}
    return out


def mlflow(uri: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    out: dict = {}
    for experiment in client.search_experiments():
        runs = []
        for run in client.search_runs([experiment.experiment_id]):
            metrics = {key: [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, key)]
                       for key in run.data.metrics}
            runs.append({"run_id": run.info.run_id, "status": run.info.status, "params": run.data.params,
                         "metrics": metrics})
        out[experiment.name] = runs
    return out


def _records(path: Path):
    """The records of a W&B run file: a LevelDB-style log (7-byte header ':W&B' + magic + version, then
    32 KiB blocks of chunks: crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left  # padding at the end of a block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def wandb(directory: str) -> dict:
    from wandb.proto import wandb_internal_pb2

    runs = []
    for run_dir in sorted(Path(directory, "wandb").glob("offline-run-*")):
        (run_file,) = run_dir.glob("run-*.wandb")
        run: dict = {"dir": run_dir.name, "config": {}, "history": []}
        for raw in _records(run_file):
            record = wandb_internal_pb2.Record.FromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["run_id"], run["project"] = record.run.run_id, record.run.project
                for item in record.run.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "config":
                for item in record.config.update:
                    run["config"][item.key] = json.loads(item.value_json)
            elif kind == "history":
                run["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                       for item in record.history.item})
        runs.append(run)
    return {"runs": runs}


if __name__ == "__main__":
    kind, where = sys.argv[1], sys.argv[2]
    print(json.dumps({"tensorboard": tensorboard, "mlflow": mlflow, "wandb": wandb}[kind](where)))
