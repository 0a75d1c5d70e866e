"""Where settings come from besides the command line: the YAML file (FAIRLANE_CONFIG, else
configs/fairlane.yaml) and FAIRLANE_* variables, read so that what no process can start with stops
it naming the file or the variable (``SettingRefused``); gateway/settings.py validates the values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource, YamlConfigSettingsSource

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent.parent / "configs" / "fairlane.yaml"
ENV_PREFIX, NESTED = "FAIRLANE_", "__"


class SettingRefused(Exception):
    """Settings no process can start with, found before their values are validated: a YAML file
    that is missing, not YAML or not a mapping, a list or mapping variable that is not JSON (not a
    ValueError, so that pydantic lets it through as it is: the message names the file or variable)."""


def config_file() -> Path | None:
    """The YAML file: the one FAIRLANE_CONFIG names (set empty: none), else configs/fairlane.yaml
    when it is there. A file FAIRLANE_CONFIG names that is not there stops the start (a typo in its
    path ran with every setting at its default)."""
    named = os.environ.get("FAIRLANE_CONFIG")
    if named is None:
        return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None
    if not named.strip():
        return None
    path = Path(named)
    if not path.is_file():
        raise SettingRefused(
            f"FAIRLANE_CONFIG names {named!r}, which is not a file (set it empty for no file)"
        )
    return path


def read_config(path: Path) -> dict[str, Any]:
    """The YAML file's settings, or SettingRefused naming the file and what is wrong with it (a
    parse error's line and column; a top level that is not a mapping)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SettingRefused(f"{path} is not valid YAML: {problem}{where}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingRefused(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SettingRefused(f"{path} must hold a mapping of settings, not a {type(data).__name__}")
    return data


class OwnYamlSource(YamlConfigSettingsSource):
    """The YAML file, keys of this process only (the file is shared by every process)."""

    def _read_file(self, file_path: Path) -> dict[str, Any]:
        return read_config(file_path)

    def __call__(self) -> dict[str, Any]:
        return {k: v for k, v in super().__call__().items() if k in self.settings_cls.model_fields}


class EnvSource(EnvSettingsSource):
    """FAIRLANE_* variables; a list or mapping setting that is not JSON is refused naming the
    variable (pydantic-settings' own error named neither it nor the rule)."""

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError:
            name = f"{ENV_PREFIX}{field_name.upper()}"
            example = '{"a": 1}' if "dict" in str(field.annotation) else '["a", "b"]'
            raise SettingRefused(
                f"{name} must be JSON, as every list or mapping setting is in the environment "
                f"(e.g. {name}='{example}')"
            ) from None
