"""Files holding keys (issue #44): one every account may write is refused, one others may read is warned about, as
ssh and PostgreSQL treat private keys; the admin key has a file of its own (`--admin-api-key-file`), so that it
need not show in the process list as a flag does."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from twinserve.config import load_config
from twinserve.errors import ConfigError

KEY = "user-key-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"


def _file(tmp_path: Path, name: str, text: str, mode: int) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_key_file_every_account_may_write_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, "keys", KEY + "\n", 0o666)
    with pytest.raises(ConfigError, match=r"^--api-key-file: .* may be written by every account \(mode 0666\)"):
        load_config(api_key_file=path)
    with pytest.raises(ConfigError, match=r"^--admin-api-key-file: .* \(mode 0606\)"):
        load_config(admin_api_key_file=_file(tmp_path, "admin", ADMIN, 0o606))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o660])
def test_a_key_file_others_may_read_is_warned_about(
    tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A Kubernetes Secret's files are 0644 unless told otherwise: a warning, not a refusal.
    path = _file(tmp_path, "keys", KEY + "\n", mode)
    with caplog.at_level(logging.WARNING, logger="twinserve.config"):
        assert load_config(api_key_file=path).all_api_keys() == [KEY]
    assert f"other accounts may read it (mode {mode:04o})" in caplog.text and KEY not in caplog.text


def test_a_private_key_file_is_taken_silently(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="twinserve.config"):
        load_config(api_key_file=_file(tmp_path, "keys", KEY + "\n", 0o600))
    assert not caplog.records


def test_a_settings_file_holding_keys_is_held_to_the_same_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = f'api_keys = ["{KEY}"]\n'
    with pytest.raises(ConfigError, match=r"--config: .* may be written by every account"):
        load_config(config_file=_file(tmp_path, "open.toml", text, 0o666))
    with caplog.at_level(logging.WARNING, logger="twinserve.config"):
        load_config(config_file=_file(tmp_path, "read.toml", text, 0o644))
    assert "--config" in caplog.text and "mode 0644" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="twinserve.config"):  # no key in it: its mode is its own business
        load_config(config_file=_file(tmp_path, "plain.toml", 'arch = "async"\n', 0o644))
    assert not caplog.records


def test_the_admin_key_from_its_file(tmp_path: Path) -> None:
    path = _file(tmp_path, "admin", f"# the repository API's key\n{ADMIN}\n", 0o600)
    config = load_config(admin_api_key_file=path)
    assert config.admin_api_key == ADMIN and config.auth_enabled
    # The server's workers validate the settings again (as JSON): the key read and the file agree.
    assert type(config).model_validate_json(config.model_dump_json()) == config
    assert load_config(admin_api_key_file=path, admin_api_key=ADMIN).admin_api_key == ADMIN
    with pytest.raises(ConfigError, match="give one"):
        load_config(admin_api_key_file=path, admin_api_key="other-admin-key-0123456789")
    with pytest.raises(ConfigError, match="must hold one key"):
        load_config(admin_api_key_file=_file(tmp_path, "two", f"{ADMIN}\n{KEY}\n", 0o600))
    assert ADMIN not in repr(config)


def test_the_admin_key_file_flag_keeps_the_key_out_of_the_command_line(tmp_path: Path) -> None:
    from twinserve.cli import build_parser

    path = _file(tmp_path, "admin", ADMIN, 0o600)
    args = build_parser().parse_args(["serve", "--admin-api-key-file", str(path)])
    assert ADMIN not in " ".join(map(str, vars(args).values()))
