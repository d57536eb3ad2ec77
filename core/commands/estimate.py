"""Accelerate's `accelerate.commands.estimate` for acc: `estimate-memory`'s parser and command, which build a model
on the meta device (nothing is downloaded but its config, nothing is allocated) and print the memory of loading it
and of training it with Adam per dtype, with the same figures as Accelerate.

A model is named as on the Hugging Face Hub (built with `transformers` or `timm`, which `huggingface_hub` looks up),
or, as acc's extension, by an import path `package.module:factory` (what `acc estimate-memory` takes), built with
no download at all. `huggingface_hub`, `transformers` and `timm` are not acc's dependencies: they are imported when a
Hub model is estimated, and their absence is an ImportError naming the pip command. Importing this module imports
neither them nor torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from acc.utils.imports import is_timm_available, is_transformers_available

DTYPE_CHOICES = ["float32", "float16", "int8", "int4"]
_DIVISORS = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}  # bytes of float32 over bytes of the dtype
_IMPORT_PATH_HINT = ("to estimate a model defined in your own code, give its import path package.module:factory "
                     "instead (built on the meta device, nothing downloaded)")


def _hub(model_name: str) -> Any:
    """huggingface_hub, or an ImportError that says how to install it."""
    try:
        import huggingface_hub
        import huggingface_hub.utils  # noqa: F401  (the error classes below live there)
    except ImportError:
        raise ImportError(
            f"estimating `{model_name}` from the Hugging Face Hub needs huggingface_hub, which is not installed: "
            f"pip install huggingface_hub (plus transformers or timm to build the model); or, {_IMPORT_PATH_HINT}"
        ) from None
    return huggingface_hub


def _hub_error(cls: type[OSError], message: str, status: int, url: str) -> OSError:
    """An instance of huggingface_hub's HTTP error class `cls` (an OSError) with `message`. huggingface_hub >= 1.0
    requires the HTTP response it came from: a synthetic one with `status` for `url` is given."""
    response_cls = getattr(sys.modules.get(cls.__module__), "Response", None)
    if response_cls is not None:
        try:
            transport = importlib.import_module(response_cls.__module__.split(".")[0])
            return cls(message, response=response_cls(status, request=transport.Request("GET", url)))  # type: ignore[call-arg]
        except Exception:  # noqa: BLE001 - an older huggingface_hub (requests' Response): the plain call below
            pass
    try:
        return cls(message)
    except Exception:  # noqa: BLE001 - a huggingface_hub whose errors cannot be built here: Accelerate's OSError
        return OSError(message)


def _is_network_error(error: BaseException) -> bool:
    """An error of the HTTP transport (httpx, requests, urllib3, ...) rather than of the Hub's answer."""
    top = type(error).__module__.split(".")[0]
    return isinstance(error, OSError) or top in {"httpx", "httpx2", "requests", "urllib3", "aiohttp", "h11"}


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """`repo`'s model info from the Hub; "gated" when access needs authentication, "repo" when no such repo is
    visible. When the Hub cannot be reached (no network, HF_HUB_OFFLINE=1) an OSError says so."""
    hub = _hub(repo)
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return hub.model_info(repo, token=token)
    except GatedRepoError:
        return "gated"
    except RepositoryNotFoundError:
        return "repo"
    except Exception as exc:
        if not _is_network_error(exc):
            raise
        reason = str(exc).rstrip(". ")
        raise OSError(f"cannot look up `{repo}` on the Hugging Face Hub: {type(exc).__name__}: {reason}. Check that "
                      f"the Hub can be reached (a network, HF_HUB_OFFLINE unset) and try again; or, "
                      f"{_IMPORT_PATH_HINT}") from exc


def check_has_model(error: BaseException) -> str:
    """Which library ('timm', 'transformers') raised `error` because the repo holds no model it can build, else
    'unknown'."""
    message = str(error)
    try:
        from huggingface_hub.utils import EntryNotFoundError as entry_not_found
    except ImportError:  # no huggingface_hub: no error of it to recognise
        entry_not_found = ()
    if is_timm_available() and ((isinstance(error, RuntimeError) and "Unknown model" in message)
                                or (entry_not_found and isinstance(error, entry_not_found))
                                or (isinstance(error, KeyError) and "architecture" in message)):
        return "timm"
    if is_transformers_available() and isinstance(error, (OSError, ValueError)) and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message):
        return "transformers"
    return "unknown"


def add_timm_hub_prefix(model_name: str) -> str:
    """`model_name` as `timm.create_model` takes it: a Hub repo id (`owner/name`) gets the `hf-hub:` source
    prefix; a bare architecture name, or a name that already has a source prefix (`hf-hub:`, `local-dir:`), is
    returned as it is."""
    if "/" in model_name and ":" not in model_name:
        return "hf-hub:" + model_name
    return model_name


def _from_import_path(model_name: str, library_name: str | None) -> Any:
    from acc.big_model.estimate import empty_model

    if library_name is not None:
        raise ValueError(f"`{model_name}` is an acc import path (package.module:factory), which builds the model "
                         f"itself; --library_name {library_name} is only for Hub models: leave it out")
    print(f"Building `{model_name}` on the meta device (an acc import path)...")
    return empty_model(model_name)


def _transformers_model(model_name: str, info: Any, trust_remote_code: bool, access_token: str | None) -> Any:
    if not is_transformers_available():
        raise ImportError(f"To check `{model_name}`, `transformers` must be installed. Please install it via "
                          "`pip install transformers`")
    import torch
    import transformers
    from packaging.version import Version

    from acc.big_model import init_empty_weights

    print(f"Loading pretrained config for `{model_name}` from `transformers`...")
    if getattr(info, "config", None) is None:
        raise RuntimeError(f"Tried to load `{model_name}` with `transformers` but it does not have any metadata.")
    auto_map = info.config.get("auto_map", False)
    config = transformers.AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code,
                                                     token=access_token)
    constructor = transformers.AutoModel
    if isinstance(auto_map, dict):  # remote code may name its own `AutoModelFor...` class
        wanted = next((key for key in auto_map if key.startswith("AutoModelFor")), None)
        if wanted is not None:
            constructor = getattr(transformers, wanted)
    # float32 explicitly: the config's own dtype would otherwise be used (`dtype` replaced `torch_dtype` in 4.56)
    dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    with init_empty_weights():
        return constructor.from_config(config, trust_remote_code=trust_remote_code, **{dtype_key: torch.float32})


def _timm_model(model_name: str) -> Any:
    if not is_timm_available():
        raise ImportError(f"To check `{model_name}`, `timm` must be installed. Please install it via "
                          "`pip install timm`")
    import timm

    from acc.big_model import init_empty_weights

    print(f"Loading pretrained config for `{model_name}` from `timm`...")
    with init_empty_weights():
        return timm.create_model(add_timm_hub_prefix(model_name), pretrained=False)


def create_empty_model(model_name: str, library_name: str | None, trust_remote_code: bool = False,
                       access_token: str | None = None) -> Any:
    """The model `model_name` names, in full precision on the meta device: a Hub model built by `library_name`
    (`transformers` or `timm`; read from the Hub's metadata when None), or acc's import path
    `package.module:factory`. `trust_remote_code` runs a repo's own modeling code: only for repos you trust."""
    from acc.big_model.estimate import is_import_path

    if is_import_path(model_name):
        return _from_import_path(model_name, library_name)
    info = verify_on_hub(model_name, access_token)
    url = f"https://huggingface.co/{model_name}"
    if info == "gated":
        from huggingface_hub.utils import GatedRepoError

        raise _hub_error(GatedRepoError, f"Repo for model `{model_name}` is gated. You must be authenticated to "
                         "access it: run `hf auth login` (or `huggingface-cli login`) with an account that was "
                         "granted access.", 403, url)
    if info == "repo":
        from huggingface_hub.utils import RepositoryNotFoundError

        raise _hub_error(RepositoryNotFoundError, f"Repo for model `{model_name}` does not exist on the Hub. If it "
                         "is a private repo, authenticate with `hf auth login` (or `huggingface-cli login`) with an "
                         f"account that has access; {_IMPORT_PATH_HINT}.", 404, url)
    if library_name is None:
        library_name = getattr(info, "library_name", None)
        if not library_name:
            raise ValueError(f"Model `{model_name}` does not have any library metadata on the Hub, please manually "
                             "pass in a `--library_name` to use (such as `transformers`)")
    if library_name == "transformers":
        return _transformers_model(model_name, info, trust_remote_code, access_token)
    if library_name == "timm":
        return _timm_model(model_name)
    raise ValueError(f"Library `{library_name}` is not supported yet: the supported libraries are `transformers` and "
                     f"`timm` (or give an acc import path package.module:factory).")


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """`rows` (lists of strings) under `headers` and `title`, in a box drawn with line characters."""
    widths = [max(len(str(cell)) for cell in column) + 2 for column in zip(headers, *rows)]
    inner = sum(widths) + len(widths) - 1
    if len(title) + 2 > inner:  # the title is wider than the columns: the last column takes up the difference
        widths[-1] += len(title) + 2 - inner
        inner = len(title) + 2

    def rule(left: str, joint: str, right: str) -> str:
        return left + joint.join("─" * w for w in widths) + right

    def line(cells: list) -> str:
        return "│" + "│".join(str(cell).center(w) for cell, w in zip(cells, widths)) + "│"

    out = ["┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", rule("├", "┬", "┤"), line(headers),
           rule("├", "┼", "┤"), *(line(row) for row in rows), rule("└", "┴", "┘")]
    return "\n".join(out)


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of `estimate-memory` (a sub-parser of `subparsers` when given, whose default `func` is
    `estimate_command`). Options take `_` or `-` between words."""
    description = "Model size estimator for fitting a model onto device (e.g. cuda, xpu) memory."
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", description=description)
    else:
        parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model_name", type=str,
                        help="The model name on the Hugging Face Hub, or (acc's extension) an import path "
                             "package.module:factory of a function or class that builds the model without "
                             "arguments; an import path needs nothing from the Hub.")
    parser.add_argument("--library_name", "--library-name", type=str, choices=["timm", "transformers"],
                        help="The library the model has an integration with, such as `transformers`, needed only "
                             "if this information is not stored on the Hub (not for an import path).")
    parser.add_argument("--dtypes", type=str, nargs="+", default=list(DTYPE_CHOICES), choices=DTYPE_CHOICES,
                        help="The dtypes to use for the model, must be one (or many) of `float32`, `float16`, "
                             "`int8`, and `int4`")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true", default=False,
                        help="Whether or not to allow for custom models defined on the Hub in their own modeling "
                             "files. Only for repositories you trust and whose code you have read: it executes "
                             "code present on the Hub on your local machine.")
    if subparsers is not None:
        parser.set_defaults(func=estimate_command)
    return parser


def estimate_training_usage(bytes: float, mixed_precision: str, msamp_config: str | None = None) -> dict:
    """Bytes of training a model of `bytes` (in float32) with Adam at batch size 1 under `mixed_precision`, as
    {"model", "optimizer", "gradients", "step"}; -1 for each where no estimate exists (int8, int4, fp8 with an
    MS-AMP config)."""
    full, half = bytes, bytes // 2
    if mixed_precision == "float32":
        return {"model": full, "optimizer": 2 * full, "gradients": full, "step": 4 * full}
    if mixed_precision in ("float16", "bfloat16") or (mixed_precision == "fp8" and msamp_config is None):
        # float32 master weights; gradients in both precisions; two float32 Adam moments, also what a step peaks at
        return {"model": full, "optimizer": 2 * full, "gradients": full + half, "step": 2 * full}
    return {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Per dtype in `args.dtypes`: [dtype, largest layer bytes, total bytes, training usage dict]."""
    from acc.big_model.estimate import calculate_maximum_sizes

    try:
        model = create_empty_model(args.model_name, library_name=getattr(args, "library_name", None),
                                   trust_remote_code=getattr(args, "trust_remote_code", False))
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        library = check_has_model(exc)
        if library != "unknown":
            raise RuntimeError(f"Tried to load `{args.model_name}` with `{library}` but a possible model to load was "
                               "not found inside the repo.") from exc
        raise
    total_size, (largest_layer, _) = calculate_maximum_sizes(model)
    data = []
    for dtype in getattr(args, "dtypes", DTYPE_CHOICES):
        if dtype not in _DIVISORS:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_CHOICES)}; give one of them")
        divisor = _DIVISORS[dtype]
        training = estimate_training_usage(total_size, dtype)
        if divisor == 1:
            data.append([dtype, largest_layer, total_size, training])
        else:
            data.append([dtype, largest_layer / divisor, total_size / divisor, training])
    return data


def estimate_command(args: argparse.Namespace) -> None:
    """Print the table of `gather_data(args)`: per dtype, the largest layer, the total size and training with Adam."""
    from acc.utils import convert_bytes

    rows = []
    for dtype, largest, total, training in gather_data(args):
        peak = max(training.values())
        rows.append([dtype, convert_bytes(largest), convert_bytes(total),
                     convert_bytes(peak) if peak != -1 else "N/A"])
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    print(create_ascii_table(headers, rows, f"Memory Usage for loading `{args.model_name}`"))


def main() -> None:
    """`python -m acc.commands.estimate MODEL`: print the table."""
    estimate_command(estimate_command_parser().parse_args())


if __name__ == "__main__":
    main()
