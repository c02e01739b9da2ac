"""The router's tenants file (``--auth apiKey --tenants-file``) is read
strictly: a typo is one line naming the file, the tenant and the field (with
the closest valid name), and the router does not start, instead of starting
with a tenant whose keys were silently dropped (every request 401)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kinference_router.tenants import Authenticator, TenantsFileError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return path


def error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(TenantsFileError) as got:
        Authenticator.from_file("apiKey", path)
    message = str(got.value)
    assert "\n" not in message
    assert message.startswith(f"tenants file {path}: ")
    return message.removeprefix(f"tenants file {path}: ")


def test_a_good_file_authenticates_its_tenants(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants:\n  - name: alice\n    apiKeys: [sk-a1, sk-a2]\n"
                           "  - name: bob\n    apiKeys: [sk-b]\n")
    auth = Authenticator.from_file("apiKey", path)
    assert auth.tenant({"authorization": "Bearer sk-a2"}) == "alice"
    assert auth.tenant({"authorization": "Bearer sk-b"}) == "bob"
    assert auth.tenant({"authorization": "Bearer sk-x"}) is None


def test_the_trials_typo_is_an_error_with_the_field_it_meant(tmp_path: Path) -> None:
    # the trial: apiKey instead of apiKeys started the router, and alice got 401
    got = error(tmp_path, "tenants:\n  - name: alice\n    apiKey: sk-x\n")
    assert got.startswith("tenant 'alice' (tenants[0]): unknown field 'apiKey' (did you mean 'apiKeys'?)")
    assert "sk-x" not in got  # never a key in a message


@pytest.mark.parametrize(("text", "want"), [
    ("tenant:\n  - name: alice\n    apiKeys: [k]\n", "unknown field 'tenant' (did you mean 'tenants'?)"),
    ("tenants:\n  - nme: alice\n    apiKeys: [k]\n", "tenants[0]: unknown field 'nme' (did you mean 'name'?)"),
    ("tenants:\n  - name: a\n    api_keys: [k]\n", "tenant 'a' (tenants[0]): unknown field 'api_keys' "
                                                  "(did you mean 'apiKeys'?)"),
    ("tenants:\n  - name: a\n    apiKeys: [k]\n    quota: 3\n", "tenant 'a' (tenants[0]): unknown field 'quota'; "
                                                               "the fields are name, apiKeys"),
])
def test_an_unknown_field_names_where_and_the_closest_valid_one(tmp_path: Path, text: str, want: str) -> None:
    assert error(tmp_path, text).startswith(want)


@pytest.mark.parametrize(("text", "want"), [
    ("tenants:\n  - name: alice\n    apiKeys: sk-secret\n",
     "tenant 'alice' (tenants[0]): field 'apiKeys' must be a list of strings, got a string"),
    ("tenants:\n  - name: alice\n    apiKeys: [12345]\n",
     "tenant 'alice' (tenants[0]): field 'apiKeys[0]' must be a string, got a number (quote it)"),
    ("tenants:\n  - name: [x]\n    apiKeys: [k]\n", "tenants[0]: field 'name' is a list, not a string"),
    ("tenants:\n  - apiKeys: [k]\n", "tenants[0]: field 'name' is missing"),
    ("tenants: {name: alice}\n", "field 'tenants' must be a list of {name, apiKeys}, got a mapping"),
    ("tenants:\n  - alice\n", "tenants[0]: expected a mapping {name, apiKeys}, got a string"),
    ("- name: alice\n", "expected a mapping tenants: [{name: NAME, apiKeys: [KEY, ...]}], got a list"),
    ("tenants:\n  - name: alice\n    apiKeys: ['  sk-a ']\n",
     "tenant 'alice' (tenants[0]): field 'apiKeys[0]' has leading or trailing whitespace"),
])
def test_a_wrong_type_names_the_tenant_and_the_field(tmp_path: Path, text: str, want: str) -> None:
    got = error(tmp_path, text)
    assert got.startswith(want), got
    assert "sk-secret" not in got and "sk-a" not in got


@pytest.mark.parametrize("keys", ["", "    apiKeys: []\n", "    apiKeys:\n"])
def test_a_tenant_without_keys_is_an_error(tmp_path: Path, keys: str) -> None:
    got = error(tmp_path, "tenants:\n  - name: alice\n" + keys)
    assert got.startswith("tenant 'alice' (tenants[0]): no keys: field 'apiKeys' is missing or empty")


@pytest.mark.parametrize("text", ["", "tenants: []\n", "tenants:\n"])
def test_a_file_without_tenants_is_an_error(tmp_path: Path, text: str) -> None:
    got = error(tmp_path, text)
    assert "empty" in got


def test_a_key_of_two_tenants_is_an_error(tmp_path: Path) -> None:
    got = error(tmp_path, "tenants:\n  - name: alice\n    apiKeys: [sk-a, sk-shared]\n"
                          "  - name: bob\n    apiKeys: [sk-b, sk-shared]\n")
    assert got == ("tenant 'bob' (tenants[1]): field 'apiKeys[1]' is also a key of tenant 'alice': "
                   "a key must belong to one tenant")


def test_a_key_written_twice_and_a_padded_name_are_errors(tmp_path: Path) -> None:
    # YAML readers keep the last of a repeated key: alice's keys would vanish
    got = error(tmp_path, "tenants:\n  - name: alice\n    apiKeys: [sk-a]\ntenants:\n  - name: bob\n    apiKeys: [sk-b]\n")
    assert "duplicate key `tenants`" in got
    got = error(tmp_path, "tenants:\n  - name: alice\n    apiKeys: [sk-a]\n    apiKeys: [sk-b]\n")
    assert "duplicate key `apiKeys`" in got and "sk-" not in got
    assert "leading or trailing whitespace" in error(tmp_path, "tenants:\n  - name: ' alice '\n    apiKeys: [sk-a]\n")


def test_bad_yaml_and_a_missing_file_are_one_line(tmp_path: Path) -> None:
    assert error(tmp_path, "tenants: [\n").startswith("not valid YAML: ")
    with pytest.raises(TenantsFileError, match=r"^tenants file /nonexistent/t.yaml: cannot read it: "):
        Authenticator.from_file("apiKey", Path("/nonexistent/t.yaml"))


def test_a_failed_load_keeps_the_keys_already_loaded(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants:\n  - name: alice\n    apiKeys: [sk-a]\n")
    auth = Authenticator.from_file("apiKey", path)
    path.write_text("tenants:\n  - name: alice\n    apiKey: sk-b\n")
    with pytest.raises(TenantsFileError):
        auth.load(path)
    assert auth.tenant({"authorization": "Bearer sk-a"}) == "alice"


def test_a_tenants_file_without_api_key_auth_is_an_error(tmp_path: Path) -> None:
    """With --auth none (the local default) the file would be ignored: every
    caller in, while the operator believes keys are asked for."""
    path = write(tmp_path, "tenants:\n  - name: alice\n    apiKeys: [sk-a]\n")
    with pytest.raises(TenantsFileError, match="read only with --auth apiKey"):
        Authenticator.from_file("none", path)
    assert Authenticator.from_file("none", None).tenant({}) == "anonymous"


def test_the_router_exits_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants:\n  - name: alice\n    apiKey: sk-x\n")
    out = subprocess.run([sys.executable, "-m", "kinference_router", "--auth", "apiKey", "--tenants-file",
                          str(path), "--nats-url", "nats://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"kinference-router: tenants file {path}: tenant 'alice' (tenants[0]): unknown field 'apiKey' "
        "(did you mean 'apiKeys'?); the fields are name, apiKeys"]
    assert "Traceback" not in out.stderr + out.stdout
