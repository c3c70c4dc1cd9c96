"""Ray secured by default: `hyspec draft-worker` joins with token auth, the local Ray gets a token.

The unit tests check the command and environment `draft-worker` builds and
the refusals, without starting Ray.  The integration tests (slow: Ray takes
tens of seconds to start here) start a token-authenticated head with
``ray start --head --block`` in a temporary directory, join it with
``hyspec draft-worker`` and connect with and without the token; each Ray
process is stopped by signalling the ``ray start --block`` that owns it.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hyspec.cli import draft_worker
from hyspec.cli.main import main
from hyspec.errors import ConfigError
from hyspec.remote import ray_security

RAY_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USE_TLS",
            "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")


@pytest.fixture
def bare_env(tmp_path, monkeypatch):
    """No Ray auth or TLS variable, and a HOME without ~/.ray/auth_token."""
    for name in RAY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture
def token_file(bare_env):
    path = bare_env / "ray_token"
    path.write_text("0123456789abcdef" * 4)
    path.chmod(0o600)
    return path


def _flags(**kw):
    return {"address": "10.1.2.3:6379", "num_cpus": None, "resources": None, "block": True, **kw}


# --- the command line and environment draft-worker builds ------------------------------------------------------

def test_dry_run_shows_token_auth_and_the_node_ip(token_file, capsys):
    assert main(["draft-worker", "--address", "10.1.2.3:6379", "--auth-token-file", str(token_file),
                 "--node-ip-address", "10.1.2.9", "--dry-run"]) == 0
    words = shlex.split(capsys.readouterr().out)
    assert words[:2] == ["RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={token_file}"]
    assert "--node-ip-address=10.1.2.9" in words and words[3] == "start"
    assert str(token_file.read_text()) not in " ".join(words)  # the token itself is never printed


def test_without_a_token_draft_worker_refuses(bare_env, capsys):
    assert main(["draft-worker", "--address", "10.1.2.3:6379", "--node-ip-address", "10.1.2.9", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--auth-token-file" in err and "no Ray auth token" in err and "--insecure-no-auth" in err


def test_insecure_flag_joins_without_a_token(bare_env):
    env = draft_worker.ray_start_env(dict(os.environ), token_file=None, insecure=True)
    assert env["RAY_AUTH_MODE"] == "disabled"


def test_token_file_flag_wins_over_an_inherited_token_value(token_file, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "some-other-clusters-token")
    env = draft_worker.ray_start_env(dict(os.environ), token_file=str(token_file), insecure=False)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(token_file)
    assert "RAY_AUTH_TOKEN" not in env  # Ray would prefer the value over the file


@pytest.mark.parametrize("token_env,where", [
    ({"RAY_AUTH_TOKEN": "abc"}, "RAY_AUTH_TOKEN"),
    ({"RAY_AUTH_TOKEN_PATH": "FILE"}, "RAY_AUTH_TOKEN_PATH"),
    ({}, "auth_token"),  # ~/.ray/auth_token, Ray's default path
])
def test_a_token_from_rays_own_places_is_accepted(token_file, bare_env, token_env, where):
    env = {"HOME": str(bare_env / "home"), **{k: str(token_file) if v == "FILE" else v for k, v in token_env.items()}}
    if not token_env:
        (bare_env / "home" / ".ray").mkdir(parents=True)
        (bare_env / "home" / ".ray" / "auth_token").write_text("tok")
    assert where in ray_security.token_source(env)
    assert draft_worker.ray_start_env(env, token_file=None, insecure=False)["RAY_AUTH_MODE"] == "token"


@pytest.mark.parametrize("env_extra,key,words", [
    ({"RAY_AUTH_MODE": "disabled"}, "RAY_AUTH_MODE", "--insecure-no-auth"),
    ({"RAY_AUTH_MODE": "tokn"}, "RAY_AUTH_MODE", "expected 'token' or 'disabled'"),
    ({"RAY_AUTH_TOKEN_PATH": "/nonexistent/token"}, "RAY_AUTH_TOKEN_PATH", "cannot read"),
    ({"RAY_AUTH_TOKEN_PATH": "EMPTY"}, "RAY_AUTH_TOKEN_PATH", "empty"),
    ({"RAY_USE_TLS": "1"}, "RAY_USE_TLS", "RAY_TLS_SERVER_CERT"),
    ({"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": "/nonexistent.pem", "RAY_TLS_SERVER_KEY": "/x",
      "RAY_TLS_CA_CERT": "/y"}, "RAY_TLS_SERVER_CERT", "not a readable file"),
])
def test_bad_security_settings_are_refused_naming_the_variable(bare_env, env_extra, key, words):
    empty = bare_env / "empty"
    empty.write_text("")
    env = {"HOME": str(bare_env / "home"), "RAY_AUTH_TOKEN": "abc",
           **{k: str(empty) if v == "EMPTY" else v for k, v in env_extra.items()}}
    if "RAY_AUTH_TOKEN_PATH" in env_extra:
        del env["RAY_AUTH_TOKEN"]
    with pytest.raises(ConfigError) as e:
        draft_worker.ray_start_env(env, token_file=None, insecure=False)
    assert key in str(e.value) and words in str(e.value)


def test_node_ip_defaults_to_the_interface_that_reaches_the_head():
    cmd = draft_worker.ray_start_command(**_flags(address="127.0.0.1:6379"))
    assert "--node-ip-address=127.0.0.1" in cmd


@pytest.mark.parametrize("ip,words", [("not-an-ip", "not an IP address"), ("8.8.8.8", "--allow-public-ip"),
                                      ("0.0.0.0", "one interface's address")])
def test_bad_node_ip_is_refused(ip, words):
    with pytest.raises(ConfigError) as e:
        draft_worker.ray_start_command(**_flags(node_ip_address=ip))
    assert e.value.key == "--node-ip-address" and words in str(e.value)


def test_a_public_node_ip_needs_the_explicit_flag():
    cmd = draft_worker.ray_start_command(**_flags(node_ip_address="8.8.8.8", allow_public_ip=True))
    assert "--node-ip-address=8.8.8.8" in cmd


def test_run_hands_ray_start_the_secured_environment(token_file, monkeypatch):
    seen = {}

    class FakeRayStart:
        def __init__(self, cmd, env):
            seen.update(cmd=cmd, env=env)

        def wait(self):
            return 0

    monkeypatch.setattr(draft_worker.subprocess, "Popen", FakeRayStart)
    assert main(["draft-worker", "--address", "10.1.2.3:6379", "--auth-token-file", str(token_file),
                 "--node-ip-address", "10.1.2.9"]) == 0
    assert seen["env"]["RAY_AUTH_MODE"] == "token" and seen["env"]["RAY_AUTH_TOKEN_PATH"] == str(token_file)
    assert "--node-ip-address=10.1.2.9" in seen["cmd"]


def test_a_stopped_draft_worker_stops_its_ray_node_and_exits_0(token_file, tmp_path):
    """SIGTERM reaches `ray start` (which stops its Ray processes) instead of orphaning it."""
    fake_ray = tmp_path / "ray"
    fake_ray.write_text("#!/bin/sh\ntrap 'echo stopped > \"$0.log\"; exit 1' TERM\necho up > \"$0.up\"\n"
                        "while true; do sleep 0.1; done\n")
    fake_ray.chmod(0o755)
    code = ("import sys, pathlib; from hyspec.cli import draft_worker; "
            f"draft_worker.shutil.which = lambda name: {str(fake_ray)!r}; "
            "draft_worker.Path = lambda p: pathlib.Path('/nonexistent/python'); "
            "from hyspec.cli.main import main; "
            f"sys.exit(main(['draft-worker', '--address', '10.1.2.3:6379', '--auth-token-file', {str(token_file)!r}, "
            "'--node-ip-address', '10.1.2.9']))")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 30
    while not (tmp_path / "ray.up").exists() and time.monotonic() < end:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.stderr.read()
    assert (tmp_path / "ray.log").read_text().strip() == "stopped"


# --- the local Ray and connections to a cluster ------------------------------------------------------------------

def test_local_ray_gets_token_auth_and_a_fresh_token_kept_off_disk(bare_env):
    updates = ray_security.local_cluster_env({"HOME": str(bare_env / "home")})
    assert updates["RAY_AUTH_MODE"] == "token" and len(updates["RAY_AUTH_TOKEN"]) >= 32
    assert not (bare_env / "home" / ".ray").exists()
    (bare_env / "home" / ".ray").mkdir(parents=True)
    (bare_env / "home" / ".ray" / "auth_token").write_text("every default local Ray of this user shares me")
    again = ray_security.local_cluster_env({"HOME": str(bare_env / "home")})
    assert again["RAY_AUTH_TOKEN"] != updates["RAY_AUTH_TOKEN"]  # fresh, not Ray's shared default file


def test_local_ray_uses_the_operators_token_and_honours_an_explicit_opt_out(token_file, bare_env):
    home = str(bare_env / "home")
    assert ray_security.local_cluster_env({"HOME": home, "RAY_AUTH_TOKEN_PATH": str(token_file)}) == {
        "RAY_AUTH_MODE": "token"}
    assert ray_security.local_cluster_env({"HOME": home, "RAY_AUTH_MODE": "disabled"}) == {}


def test_connecting_to_a_cluster_without_a_token_is_refused(bare_env, monkeypatch):
    pytest.importorskip("ray")
    from ray._private import auto_init_hook

    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", auto_init_hook.enable_auto_connect)  # restored after
    monkeypatch.delenv("RAY_ENABLE_AUTO_CONNECT", raising=False)
    from hyspec.remote import cluster
    from hyspec.remote.transport import RemoteUnavailable

    with pytest.raises(RemoteUnavailable) as e:
        cluster.connect("127.0.0.1:1")  # refused before any connection is tried
    assert "no Ray auth token" in str(e.value) and "RAY_AUTH_TOKEN_PATH" in str(e.value)


def test_cluster_module_no_longer_claims_a_loopback_bind():
    from hyspec.remote import cluster

    assert "bound to 127.0.0.1" not in (cluster.__doc__ or "")
    assert "_node_ip_address" not in Path(cluster.__file__).read_text()  # Ray rewrites 127.0.0.1 anyway


# --- integration: a real local Ray with token auth (and TLS), a draft-worker join, clients with and without ----------

HEAD = """
import sys, ray
from hyspec.remote import cluster
assert cluster.connect(None)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.readline()
ray.shutdown()
"""
CLIENT = ("import ray; ray.init(address={address!r}); "
          "print('draft slots', ray.cluster_resources().get('hyspec_draft')); "
          "print(ray.get(ray.remote(lambda: 'a task ran').remote())); ray.shutdown()")


def _client(address: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLIENT.format(address=address)], env=env, capture_output=True,
                          text=True, timeout=180)


def _without(env: dict, prefix: str) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(prefix)}


class LocalHead:
    """hyspec's own local Ray (cluster.connect(None)) in a child process, stopped through its stdin."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-c", HEAD], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.address = self.proc.stdout.readline().strip()
        assert self.address, f"the head exited with {self.proc.wait()}"

    def stop(self) -> int:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.wait(120)


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(120)


@pytest.mark.slow
def test_draft_worker_joins_a_token_head_and_a_client_without_the_token_is_refused(token_file, bare_env):
    pytest.importorskip("ray")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    head = LocalHead(env)
    worker = None
    try:
        worker = subprocess.Popen([str(Path(sys.executable).with_name("hyspec")), "draft-worker", "--address",
                                   head.address, "--auth-token-file", str(token_file), "--num-cpus=1"],
                                  env=_without(env, "RAY_AUTH"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        end = time.monotonic() + 120
        while True:  # the local head offers one slot, the joined node a second
            with_token = _client(head.address, env)
            if "draft slots 2.0" in with_token.stdout or time.monotonic() > end or worker.poll() is not None:
                break
            time.sleep(2)
        assert "draft slots 2.0" in with_token.stdout, (worker.poll(), with_token.stderr[-2000:])
        without = _client(head.address, _without(env, "RAY_AUTH"))
        assert without.returncode != 0 and "a task ran" not in without.stdout
    finally:
        codes = ([_stop(worker)] if worker is not None else []) + [head.stop()]
    assert codes == [0] * len(codes), worker.stderr.read()[-2000:] if worker else ""


@pytest.mark.slow
def test_local_ray_over_tls_refuses_a_client_without_tls(token_file, bare_env):
    pytest.importorskip("ray")
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    ip = socket.gethostbyname(socket.gethostname())
    cert, key = bare_env / "cert.pem", bare_env / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=hyspec-ray", "-addext",
                    f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:127.0.0.1,IP:{_route_ip()},DNS:{_route_ip()}"
                    + (f",DNS:{ip}" if ip != _route_ip() else "")],
                   check=True, capture_output=True)
    tls = {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(cert), "RAY_TLS_SERVER_KEY": str(key),
           "RAY_TLS_CA_CERT": str(cert)}
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file), **tls}
    head = LocalHead(env)
    try:
        with_tls = _client(head.address, env)
        assert "a task ran" in with_tls.stdout, with_tls.stderr[-2000:]
        try:
            plain = _client(head.address, _without(env, "RAY_USE_TLS"))
            assert plain.returncode != 0 and "a task ran" not in plain.stdout
        except subprocess.TimeoutExpired:
            pass  # a plain client may also wait for an answer the TLS server never gives
    finally:
        assert head.stop() == 0


def _route_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        return s.getsockname()[0]


def test_after_connect_a_stray_ray_call_never_connects_to_another_cluster(monkeypatch):
    """Ray's auto-init would connect a `ray.kill` after `ray.shutdown` to whichever cluster
    /tmp/ray/ray_current_cluster names (another user's on a shared box) and send it pickles."""
    ray = pytest.importorskip("ray")
    from ray._private import auto_init_hook

    from hyspec.remote import cluster

    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", True)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # as if this process had connected already
    monkeypatch.delenv("RAY_ENABLE_AUTO_CONNECT", raising=False)
    assert cluster.connect(None) is False
    assert auto_init_hook.enable_auto_connect is False and os.environ["RAY_ENABLE_AUTO_CONNECT"] == "0"
