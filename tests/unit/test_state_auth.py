"""The worker's state endpoints and their bearer token (eopipe.dedup.auth): who gets an answer."""

from __future__ import annotations

import pytest

from eopipe.dedup import auth

TOKEN = "s3cret-Token_0123456789"


@pytest.mark.parametrize("path, header, token, insecure, code", [
    # Open endpoints: probes and Prometheus carry no token.
    ("/healthz", None, TOKEN, False, None),
    ("/readyz", None, TOKEN, False, None),
    ("/metrics", None, TOKEN, False, None),
    ("/status", None, TOKEN, False, None),
    ("/metrics", None, None, False, None),
    # The state endpoints with a token.
    ("/snapshots/3", f"Bearer {TOKEN}", TOKEN, False, None),
    ("/reshard/7/1/5", f"Bearer {TOKEN}", TOKEN, False, None),
    ("/snapshots/3", f"bearer {TOKEN}", TOKEN, False, None),     # the scheme is case-insensitive
    ("/snapshots/3", None, TOKEN, False, 401),
    ("/snapshots/3", "", TOKEN, False, 401),
    ("/snapshots/3", "Bearer", TOKEN, False, 401),
    ("/snapshots/3", "Bearer ", TOKEN, False, 401),
    ("/snapshots/3", "Bearer wrong", TOKEN, False, 401),
    ("/snapshots/3", f"Bearer {TOKEN[:-1]}", TOKEN, False, 401),  # a prefix is not the token
    ("/snapshots/3", f"Bearer {TOKEN}x", TOKEN, False, 401),
    ("/snapshots/3", f"Basic {TOKEN}", TOKEN, False, 401),
    ("/snapshots/3", TOKEN, TOKEN, False, 401),                   # no scheme
    ("/reshard/7/1/5", None, TOKEN, False, 401),
    # A token set wins over --insecure-state-endpoints (config refuses both anyway).
    ("/snapshots/3", None, TOKEN, True, 401),
    # No token: refused unless explicitly insecure.
    ("/snapshots/3", None, None, False, 403),
    ("/reshard/7/1/5", "Bearer anything", None, False, 403),
    ("/snapshots/3", None, None, True, None),
])
def test_refusal(path, header, token, insecure, code):
    # The decision is taken on the routed request, never on the raw target.
    res = auth.refusal(auth.route("GET", path, "HTTP/1.1"), header, token, insecure)
    assert (res[0] if res else None) == code
    if code == 401:
        assert res[1]["WWW-Authenticate"].startswith("Bearer")
        assert TOKEN.encode() not in res[2]


def test_headers():
    assert auth.headers(TOKEN) == {"Authorization": f"Bearer {TOKEN}"}
    assert auth.headers(None) == {}


@pytest.mark.parametrize("env, file_text, want, error", [
    ({}, None, None, None),
    ({"EOPIPE_TOKEN": TOKEN}, None, TOKEN, None),
    ({"EOPIPE_TOKEN": f" {TOKEN}\n"}, None, TOKEN, None),
    ({"EOPIPE_TOKEN": ""}, None, None, "env EOPIPE_TOKEN is empty"),
    ({"EOPIPE_TOKEN": "two words"}, None, None, "one word"),
    ({}, f"{TOKEN}\n", TOKEN, None),                         # a mounted Secret file ends in a newline or not
    ({"EOPIPE_TOKEN": "from-env"}, TOKEN, TOKEN, None),      # the file wins
    ({}, "\n", None, "is empty"),
])
def test_read_token(tmp_path, env, file_text, want, error):
    path = None
    if file_text is not None:
        path = tmp_path / "token"
        path.write_text(file_text)
    if error:
        with pytest.raises(ValueError, match=error) as e:
            auth.read_token(env, str(path) if path else None)
        assert TOKEN not in str(e.value)
    else:
        assert auth.read_token(env, str(path) if path else None) == want


def test_read_token_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read --token-file"):
        auth.read_token({}, str(tmp_path / "nope"))


def _config(argv, env, monkeypatch):
    import argparse

    from eopipe.dedup import cli

    for k in ("EOPIPE_TOKEN", "EOPIPE_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    sub = argparse.ArgumentParser().add_subparsers()
    cli.add_parser(sub)
    args = sub.choices["dedup"].parse_args(["--bootstrap", "k:9092", "--source-topic", "s", "--output-topic", "o",
                                            "--pipeline", "p", "--partitions", "0", *argv])
    return cli.config_from_args(args)


@pytest.mark.parametrize("argv, env, token, insecure, error", [
    ([], {"EOPIPE_TOKEN": TOKEN}, TOKEN, False, None),          # as a pod gets it (secretKeyRef)
    ([], {}, None, False, None),                                # refuses the state endpoints
    (["--insecure-state-endpoints"], {}, None, True, None),
    (["--insecure-state-endpoints"], {"EOPIPE_TOKEN": TOKEN}, None, None, "give one or the other"),
    ([], {"EOPIPE_TOKEN": "  "}, None, None, "EOPIPE_TOKEN is empty"),
])
def test_worker_config_token(monkeypatch, argv, env, token, insecure, error):
    if error:
        with pytest.raises(ValueError, match=error):
            _config(argv, env, monkeypatch)
        return
    cfg = _config(argv, env, monkeypatch)
    assert cfg.token == token and cfg.insecure_state_endpoints is insecure
    assert TOKEN not in repr(cfg)  # never in a logged config


def test_worker_config_token_file(monkeypatch, tmp_path):
    (tmp_path / "t").write_text(TOKEN + "\n")
    assert _config(["--token-file", str(tmp_path / "t")], {}, monkeypatch).token == TOKEN
    assert _config([], {"EOPIPE_TOKEN_FILE": str(tmp_path / "t")}, monkeypatch).token == TOKEN
