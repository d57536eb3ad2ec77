"""The `mlflow` tracker (Accelerate's MLflowTracker): one MLflow run in the experiment named after the project.

Where the run goes: `tracking_uri=` (init_kwargs), else MLFLOW_TRACKING_URI, else a local store under the
Accelerator's project/logging directory: <logging_dir>/mlflow.db (MLflow's sqlite store; MLflow 3 keeps its
file store `file:...` only with MLFLOW_ALLOW_FILE_STORE=true) with artifacts in <logging_dir>/mlartifacts, else
MLflow's own default. MLflow's
variables MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_ID, MLFLOW_TAGS and MLFLOW_NESTED_RUN win over the arguments, as in
Accelerate. The mlflow library is imported in `start`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from acc.tracking import GeneralTracker, Unstorable, hyperparameters, on_main_process, say, split_values


class MLflowTracker(GeneralTracker):
    """Params (hyper-parameters, as MLflow stores them: strings) and metrics with steps; `tracker` is the
    mlflow.ActiveRun."""

    name = "mlflow"
    requires_logging_directory = False
    accepts_logging_directory = True
    ACC_REQUIRES = ("mlflow",)

    def __init__(self, experiment_name: str | None = None, logging_dir: str | os.PathLike | None = None,
                 run_id: str | None = None, tags: dict | str | None = None, nested_run: bool = False,
                 run_name: str | None = None, description: str | None = None, tracking_uri: str | None = None):
        super().__init__()
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        nested = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.nested_run = nested.strip().lower() in ("1", "true", "yes") if isinstance(nested, str) else bool(nested)
        self.run_name = run_name
        self.description = description
        self.tracking_uri = tracking_uri
        self.active_run: Any = None
        self._unstorable = Unstorable(self.name, "numbers (MLflow metrics)")

    def _store(self) -> tuple[str | None, str | None]:
        """(tracking URI to set, artifact location of a new experiment); None: MLflow's own choice."""
        if self.tracking_uri:
            return self.tracking_uri, None
        if os.environ.get("MLFLOW_TRACKING_URI") or self.logging_dir is None:
            return None, None  # mlflow reads the variable itself
        directory = Path(self.logging_dir).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{directory / 'mlflow.db'}", (directory / "mlartifacts").as_uri()

    @on_main_process
    def start(self) -> None:
        import mlflow

        uri, artifacts = self._store()
        if uri is not None:
            mlflow.set_tracking_uri(uri)
        experiment = mlflow.get_experiment_by_name(self.experiment_name) if self.experiment_name else None
        if experiment is not None:
            experiment_id = experiment.experiment_id
        elif self.experiment_name:
            experiment_id = mlflow.create_experiment(name=self.experiment_name, artifact_location=artifacts,
                                                     tags=self.tags)
        else:
            experiment_id = None
        self.active_run = mlflow.start_run(run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
                                           nested=self.nested_run, tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        import mlflow
        from mlflow.utils import validation

        limit = getattr(validation, "MAX_PARAM_VAL_LENGTH", 6000)
        batch = getattr(validation, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        params = {}
        for key, value in hyperparameters(values, self.name).items():
            if len(str(value)) > limit:
                say(f"tracker 'mlflow' cannot store hyper-parameter '{key}': {len(str(value))} characters, MLflow "
                    f"keeps at most {limit} in a param; left out")
            else:
                params[key] = value
        items = list(params.items())
        for i in range(0, len(items), batch):
            mlflow.log_params(dict(items[i:i + batch]))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        import mlflow

        numbers, _ = split_values(values, self._unstorable, keep_text=False)
        if numbers:
            mlflow.log_metrics({k: float(v) for k, v in numbers.items()}, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        if self.active_run is not None:
            import mlflow

            mlflow.end_run()
            self.active_run = None
