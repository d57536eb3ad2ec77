"""Secrets never recorded: the values of arguments, settings, environment variables and tracker hyper-parameters
whose names look like credentials are replaced by REDACTED wherever acc writes or shows them (the run manifest,
checkpoint manifests, tracker configurations, the dry run, `acc env`). Torch-free.

The rule (documented in docs/security.md, "Credentials are not recorded"):

- **By name.** A name is split into words at every character that is not a letter or digit and at lower-to-upper
  case changes (`--hf_token`, `HF_TOKEN`, `hfToken`, `wandb.api-key` all give ...token / ...key). It looks like a
  credential when one of its words is in WORDS (`token`, `key`, `secret`, `password`, `auth`, `credentials`, ...)
  or two neighbouring words are in PAIRS (`connection string`). That covers the tracker and hub variables
  (`HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, `WANDB_API_KEY`, `COMET_API_KEY`, `NEPTUNE_API_TOKEN`,
  `MLFLOW_TRACKING_PASSWORD`, `CLEARML_API_SECRET_KEY`, `AWS_SECRET_ACCESS_KEY`, `GITHUB_TOKEN`, ...). Words that
  merely contain one (`tokenizer`, `max_tokens`, `keys`, `author`) do not count. A switch (a boolean value, e.g.
  `use_auth_token=True`) is kept.
- **Arguments.** In a command line, `--NAME VALUE`, `--NAME=VALUE`, `-NAME VALUE` and `NAME=VALUE` (Hydra style) are
  redacted when NAME looks like a credential (the next argument is taken as the value unless it starts with `-`).
- **By value, whatever the name.** Values shaped like well-known tokens (Hugging Face `hf_...`, GitHub `ghp_`/
  `github_pat_...`, OpenAI/Anthropic `sk-...`, Slack `xox?-...`, AWS access key ids `AKIA...`, Weights & Biases
  local keys) and the password of a URL (`https://user:PASSWORD@host`) are redacted too.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

REDACTED = "<redacted>"

WORDS = frozenset({
    "token", "key", "apikey", "accesskey", "privatekey", "secret", "secrets", "password", "passwd", "passphrase",
    "auth", "authorization", "credential", "credentials", "creds", "cookie", "jwt", "bearer",
})
PAIRS = frozenset({("api", "keys"), ("connection", "string"), ("sas", "url")})
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_TOKEN_VALUES = re.compile(
    r"hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|sk-[A-Za-z0-9_\-]{20,}"  # OpenAI, Anthropic
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    r"|local-[0-9a-f]{40}"  # Weights & Biases local server keys
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?P<password>[^/\s@]+)(?P<at>@)")


def words(name: str) -> list[str]:
    """`name` split into lower-case words (`--hf_token` -> ['hf', 'token'], `apiKey` -> ['api', 'key'])."""
    return [w.lower() for w in _WORD.findall(name)]


def is_secret_name(name: str) -> bool:
    """Whether `name` (an argument, setting, variable or hyper-parameter name) looks like a credential's."""
    if not isinstance(name, str) or not name:
        return False
    parts = words(name)
    return any(w in WORDS for w in parts) or any(pair in PAIRS for pair in zip(parts, parts[1:]))


def redact_text(text: str) -> str:
    """`text` with token-shaped values and URL passwords replaced (names are not looked at)."""
    if not isinstance(text, str) or not text:
        return text
    text = _TOKEN_VALUES.sub(REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("at"), text)


def redact_value(name: Any, value: Any) -> Any:
    """`value` as it may be recorded under `name` (REDACTED when the name looks like a credential's; strings and
    containers are searched for token-shaped values either way)."""
    if isinstance(name, str) and is_secret_name(name) and value not in (None, "", [], {}, False):
        if isinstance(value, bool):
            return value  # a switch (--use-auth-token) holds no secret
        return REDACTED
    return redact_data(value)


def redact_data(value: Any) -> Any:
    """A copy of JSON-like data (dicts, lists, strings) with every secret value redacted (keys are the names)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact_value(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(v) for v in value) if type(value) in (list, tuple) else value
    return value


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with the values of credential-like options redacted (see the module's rule)."""
    args = [str(a) for a in argv]
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if eq and is_secret_name(name.lstrip("-")) and not name.lstrip("-").startswith("-"):
            out.append(f"{name}={REDACTED}" if value else arg)
        elif arg.startswith("-") and len(arg) > 1 and not eq and is_secret_name(arg.lstrip("-")) and \
                i + 1 < len(args) and not args[i + 1].startswith("-"):
            out += [arg, REDACTED]
            i += 1
        else:
            out.append(redact_text(arg))
        i += 1
    return out


def redact_shell(command: str) -> str:
    """A shell command line (as `shlex.join` writes it) with its secrets redacted, as `redact_argv` does."""
    import shlex

    try:
        args = shlex.split(command)
    except ValueError:  # not a shell line (unbalanced quotes): the values alone
        return redact_text(command)
    redacted = redact_argv(args)
    return command if redacted == args else shlex.join(redacted)


def redact_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables with the values of credential-like ones redacted."""
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(v)) for k, v in environ.items()}


__all__ = ["REDACTED", "is_secret_name", "redact_argv", "redact_data", "redact_environ", "redact_shell",
           "redact_text", "redact_value", "words"]
