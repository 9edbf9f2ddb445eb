"""The custodian's credential registry and redactor (_secrets.py): each form a registered value
may take in a text is replaced by a marker, overlapping values are covered whole, a value too
short to tell from ordinary text is refused, log records leave redacted (message, args,
exception, extras) in both log formats, and the credentials a custodian's settings name are
all registered (git credential-store lines, DSNs, a Secret volume's keys, the service-account
token)."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from corral_common import logs
from corral_custodian import _secrets
from corral_custodian._secrets import (
    SecretRegistry,
    SecretTooShort,
    redact_handlers,
)
from corral_custodian.settings import SettingsError, from_env, register_credentials

# A value with every kind of character an encoder treats specially: '/', '+', '=', ':', a
# quote, a backslash, a space and a non-ASCII letter.
KEY = 'sk-ant/Zq+9"x\\y=é:1~ end'
MARK = "[redacted:model-key]"


@pytest.fixture
def registry() -> SecretRegistry:
    secrets = SecretRegistry()
    secrets.register("model-key", KEY)
    return secrets


@pytest.fixture
def global_registry() -> Iterator[SecretRegistry]:
    """The process's registry, empty before and after the test."""
    _secrets.registry.clear()
    yield _secrets.registry
    _secrets.registry.clear()


def _b64(data: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()


def _unicode_escapes(text: str, upper: bool) -> str:
    units = text.encode("utf-16-be")
    return "".join(
        "\\u" + format(int.from_bytes(units[i : i + 2], "big"), "04X" if upper else "04x")
        for i in range(0, len(units), 2)
    )


RAW = KEY.encode()
FORMS: dict[str, str] = {
    "plain": KEY,
    "base64": _b64(RAW),
    "base64 unpadded": _b64(RAW).rstrip("="),
    "base64 url-safe": _b64(RAW, urlsafe=True),
    "base64 url-safe unpadded": _b64(RAW, urlsafe=True).rstrip("="),
    "quote": quote(KEY, safe=""),
    "quote with /": quote(KEY),
    "quote_plus": quote_plus(KEY),
    "quote lower-case escapes": "%".join(
        p if i == 0 else p[:2].lower() + p[2:] for i, p in enumerate(quote(KEY, safe="").split("%"))
    ),
    "hex": RAW.hex(),
    "HEX": RAW.hex().upper(),
    "\\u escapes": _unicode_escapes(KEY, upper=False),
    "\\u ESCAPES": _unicode_escapes(KEY, upper=True),
    "json.dumps": json.dumps(KEY)[1:-1],
    "json.dumps not ascii": json.dumps(KEY, ensure_ascii=False)[1:-1],
    "json.dumps of the \\u escapes": json.dumps(_unicode_escapes(KEY, upper=False))[1:-1],
    "repr": repr(KEY)[1:-1],
    "ascii": ascii(KEY)[1:-1],
    "json.dumps of repr": json.dumps(repr(KEY)[1:-1])[1:-1],
}


@pytest.mark.parametrize("label", sorted(FORMS))
def test_each_encoding_of_a_registered_value_is_redacted_in_a_text(
    registry: SecretRegistry, label: str
) -> None:
    form = FORMS[label]
    text = f"git said: fatal: {form} does not exist (exit 128)"
    redacted = registry.redact(text)
    assert redacted == f"git said: fatal: {MARK} does not exist (exit 128)", label


@pytest.mark.parametrize("before", range(6))
@pytest.mark.parametrize("urlsafe", [False, True])
def test_a_value_inside_a_longer_base64_text_is_redacted_at_every_alignment(
    registry: SecretRegistry, before: int, urlsafe: bool
) -> None:
    for after in range(4):
        blob = _b64(os.urandom(before) + RAW + os.urandom(after), urlsafe)
        redacted = registry.redact(f"data: {blob}")
        assert MARK in redacted
        # What is left of the blob around the marker is at most the two groups the value
        # shares with its neighbours: too little to rebuild any of it.
        left = redacted.removeprefix("data: ").replace(MARK, "")
        assert len(left) <= len(blob) - len(RAW) * 4 // 3 + 8, (before, after, redacted)


def test_a_credential_shorter_than_8_characters_is_refused_naming_it_not_its_value() -> None:
    secrets = SecretRegistry()
    with pytest.raises(SecretTooShort) as refused:
        secrets.register("model-key", "sk-12\n")
    assert "'model-key'" in str(refused.value) and "5 characters" in str(refused.value)
    assert "sk-12" not in str(refused.value)
    with pytest.raises(SecretTooShort):
        secrets.register_basic("git-credential", "x-access-token", "short")
    assert secrets.values() == []
    secrets.register("model-key", "12345678")  # 8 is enough
    assert secrets.redact("k=12345678") == "k=[redacted:model-key]"


def test_nothing_registered_leaves_text_alone_and_empty_values_register_nothing() -> None:
    secrets = SecretRegistry()
    secrets.register("model-key", None)
    secrets.register("model-key", " \n")
    assert not secrets and secrets.values() == []
    assert secrets.redact("nothing to hide") == "nothing to hide"


def test_overlapping_values_are_both_covered_whole() -> None:
    secrets = SecretRegistry()
    secrets.register("wire-token", "abcdefgh12")
    secrets.register("model-key", "12345678xyz")
    secrets.register("custodian-credential", "outer-0123456789-outer")
    secrets.register("memory-password", "0123456789")  # inside the credential above
    # The two overlap in the text: neither's remainder may show.
    assert secrets.redact("[abcdefgh12345678xyz]") == "[[redacted:wire-token,model-key]]"
    assert secrets.redact("a outer-0123456789-outer b 0123456789") == (
        "a [redacted:custodian-credential,memory-password] b [redacted:memory-password]"
    )
    # Repeats, back to back and apart.
    assert secrets.redact("0123456789 0123456789") == (
        "[redacted:memory-password] [redacted:memory-password]"
    )


def test_a_value_registered_again_is_kept_once_and_a_new_one_joins_it() -> None:
    secrets = SecretRegistry()
    secrets.register("service-account-token", "token-one-aaaaaaaa")
    secrets.register("service-account-token", "token-one-aaaaaaaa\n")
    secrets.register("service-account-token", "token-two-bbbbbbbb")  # rotated
    assert secrets.values() == ["token-one-aaaaaaaa", "token-two-bbbbbbbb"]
    assert secrets.redact("token-one-aaaaaaaa token-two-bbbbbbbb") == (
        "[redacted:service-account-token] [redacted:service-account-token]"
    )


def test_a_user_and_token_pair_is_redacted_in_a_url_and_in_http_basic() -> None:
    secrets = SecretRegistry()
    token = "ghp_Tok/en+with=odd:chars"
    secrets.register_basic("git-credential", "x-access-token", token)
    mark = "[redacted:git-credential]"
    line = f"https://x-access-token:{quote(token, safe='')}@git.example.com/org/repo.git"
    assert secrets.redact(line) == f"https://{mark}@git.example.com/org/repo.git"
    assert secrets.redact(f"https://x-access-token:{token}@host") == f"https://{mark}@host"
    basic = _b64(f"x-access-token:{token}".encode())
    assert secrets.redact(f"Authorization: Basic {basic}") == f"Authorization: Basic {mark}"
    assert secrets.values() == [token]


def test_redact_is_fast_on_the_texts_it_sees() -> None:
    import time

    secrets = SecretRegistry()
    for i in range(12):
        secrets.register(f"credential-{i}", base64.b64encode(os.urandom(33)).decode())
    secrets.register_basic("git-credential", "x-access-token", "ghp_" + os.urandom(18).hex())
    text = json.dumps({"content": "ordinary tool output " * 200, "isError": False})
    started = time.perf_counter()
    for _ in range(200):
        secrets.redact(text)
    per_call = (time.perf_counter() - started) / 200
    assert per_call < 0.005, f"{per_call * 1000:.2f} ms for a {len(text)}-character text"


# --- logs --------------------------------------------------------------------------------------


def _logger(
    secrets: SecretRegistry, formatter: logging.Formatter
) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    redact_handlers([handler])
    redact_handlers([handler])  # once is enough: a second call adds nothing
    assert len(handler.filters) == 1
    logger = logging.getLogger(f"corral_custodian.test_secrets.{id(stream)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return logger, stream


@pytest.mark.parametrize("formatter", [logs.JsonFormatter, logs.TextFormatter])
def test_a_log_record_leaves_with_its_args_exception_and_extras_redacted(
    global_registry: SecretRegistry, formatter: Callable[[], logging.Formatter]
) -> None:
    global_registry.register("model-key", KEY)
    logger, stream = _logger(global_registry, formatter())
    try:
        raise RuntimeError(f"upstream said {_b64(RAW)}")
    except RuntimeError:
        logger.exception("delivery failed: %s (%d tries)", quote(KEY, safe=""), 3)
    logger.warning("hook answered %r", {"echo": KEY}, extra={"header": f"Bearer {KEY}"})
    written = stream.getvalue()
    for form in (KEY, _b64(RAW), quote(KEY, safe=""), json.dumps(KEY)[1:-1]):
        assert form not in written
    assert f"delivery failed: {MARK} (3 tries)" in written
    assert f"RuntimeError: upstream said {MARK}" in written  # the exception is still there
    assert "Traceback (most recent call last)" in written
    assert "hook answered {'echo': '" + MARK + "'}" in written
    if formatter is logs.JsonFormatter:
        lines = [json.loads(line) for line in written.splitlines() if line.startswith("{")]
        assert lines[0]["exception"].endswith(f"RuntimeError: upstream said {MARK}")
        assert lines[1]["header"] == f"Bearer {MARK}"


def test_a_private_registry_redacts_only_its_own_values(global_registry: SecretRegistry) -> None:
    mine = SecretRegistry()
    mine.register("wire-token", "wire-token-value-1234")
    global_registry.register("model-key", KEY)
    logger, stream = _logger(mine, logs.TextFormatter())
    logger.handlers[0].filters = [_secrets.RedactingFilter(mine)]
    logger.info("a %s b %s", "wire-token-value-1234", "not-a-secret")
    assert "a [redacted:wire-token] b not-a-secret" in stream.getvalue()


# --- what the custodian's settings hold --------------------------------------------------------

AGENT = json.dumps({"identity": "x", "model": "claude-haiku-4-5"})


def _secret_file(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    return str(path)


def test_every_credential_the_settings_name_is_registered(
    global_registry: SecretRegistry, tmp_path: Path
) -> None:
    model_key = "sk-ant-" + os.urandom(12).hex()
    credential = "pod-local-" + os.urandom(12).hex()
    wire_token = "wire-" + os.urandom(12).hex()
    git_token = "ghp_" + os.urandom(12).hex() + "/+"
    other_token = "glpat-" + os.urandom(12).hex()
    db_password = "pg pass " + os.urandom(6).hex()
    sa_token = "eyJhbGciOiJSUzI1NiJ9." + os.urandom(24).hex()
    hook_secret = "hook-" + os.urandom(12).hex()
    # A Secret volume as the kubelet writes it: keys are links into a timestamped directory.
    hooks = tmp_path / "hooks"
    (hooks / "..2024_01_01_00_00_00.1").mkdir(parents=True)
    (hooks / "..2024_01_01_00_00_00.1" / "token").write_text(hook_secret + "\n")
    (hooks / "..data").symlink_to("..2024_01_01_00_00_00.1")
    (hooks / "token").symlink_to("..data/token")
    git_lines = [
        f"https://x-access-token:{quote(git_token, safe='')}@github.example.com",
        "",
        "https://git.example.com",  # no credential on this line: nothing to register
        f"https://oauth2:{other_token}@gitlab.example.com",
    ]
    (tmp_path / "kube-token").write_text(sa_token)
    env = {
        "CORRAL_AGENT_SPEC_JSON": AGENT,
        "ANTHROPIC_API_KEY": model_key,
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": _secret_file(tmp_path / "credential", credential),
        "CORRAL_CUSTODIAN_OPERATOR_ADDR": "127.0.0.1:18082",
        "CORRAL_WIRE_TOKEN_FILE": _secret_file(tmp_path / "token", wire_token),
        "CORRAL_GIT_CREDENTIALS_FILE": _secret_file(tmp_path / "git", "\n".join(git_lines)),
        "CORRAL_MEMORY_DSN_FILE": _secret_file(
            tmp_path / "dsn", f"host=db user=corral password='{db_password}' dbname=memory"
        ),
        "CORRAL_HOOK_SECRET_DIR": str(hooks),
        "CORRAL_KUBE_API": "https://127.0.0.1:6443",
        "CORRAL_KUBE_TOKEN_FILE": str(tmp_path / "kube-token"),
        "CORRAL_SESSION_UID": "uid-1",
    }
    register_credentials(from_env(env))
    values = global_registry.values()
    for value in (model_key, credential, wire_token, git_token, other_token, sa_token):
        assert value in values
    assert hook_secret in values and db_password in values
    assert not any(v.startswith("https://git.example.com") for v in values)
    text = " ".join(
        [
            model_key,
            _b64(f"x-access-token:{git_token}".encode()),
            git_lines[0],
            f"Bearer {sa_token}",
            quote(db_password),
            hook_secret.encode().hex(),
        ]
    )
    redacted = global_registry.redact(text)
    assert redacted == (
        "[redacted:model-key] [redacted:git-credential] https://[redacted:git-credential]"
        "@github.example.com Bearer [redacted:service-account-token] "
        "[redacted:memory-password] [redacted:hook-secret]"
    )


@pytest.mark.parametrize(
    ("dsn", "password"),
    [
        ("postgresql://corral:pa%2Fss-word-1@db:5432/memory", "pa/ss-word-1"),
        ("postgresql://corral@db/memory?sslmode=require&password=query-pass-1", "query-pass-1"),
        ("host=db password=plain-pass-1 user=corral", "plain-pass-1"),
        ("host=db password = 'quoted \\' pass' user=corral", "quoted ' pass"),
    ],
)
def test_a_memory_dsn_and_its_password_are_registered(
    global_registry: SecretRegistry, dsn: str, password: str
) -> None:
    from corral_custodian.settings import register_dsn

    register_dsn(dsn)
    assert global_registry.values() == [dsn, password]
    assert global_registry.redact(f"failed: {password}") == "failed: [redacted:memory-password]"


@pytest.mark.parametrize(
    ("env_name", "named"),
    [
        ("CORRAL_WIRE_TOKEN_FILE", "CORRAL_WIRE_TOKEN_FILE"),
        ("CORRAL_MEMORY_DSN_FILE", "the password in CORRAL_MEMORY_DSN_FILE"),
        ("CORRAL_GIT_CREDENTIALS_FILE", "line 1 of CORRAL_GIT_CREDENTIALS_FILE"),
    ],
)
def test_a_short_credential_in_the_settings_is_a_settings_error_naming_it(
    global_registry: SecretRegistry, tmp_path: Path, env_name: str, named: str
) -> None:
    short = {
        "CORRAL_WIRE_TOKEN_FILE": "tiny",
        "CORRAL_MEMORY_DSN_FILE": "postgresql://corral:pw@db/memory",
        "CORRAL_GIT_CREDENTIALS_FILE": "https://x-access-token:ghp1@github.example.com",
    }[env_name]
    env = {
        "CORRAL_AGENT_SPEC_JSON": AGENT,
        "CORRAL_CUSTODIAN_INSECURE": "1",
        env_name: _secret_file(tmp_path / "secret", short),
    }
    with pytest.raises(SettingsError) as refused:
        register_credentials(from_env(env))
    assert named in str(refused.value) and "at least 8" in str(refused.value)
