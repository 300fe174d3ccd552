"""Training recipes shipped inside the package (``imgpipe/train/recipes/NAME.yaml``): configs to start from.

``imgpipe train --recipe NAME`` reads one under ``--config`` and ``--set`` (see
:func:`imgpipe.train.config.load_config`); ``--list-recipes`` names them with their first comment line.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from imgpipe.errors import ConfigError

SUFFIX = ".yaml"


def _folder() -> Any:  # a Traversable
    return resources.files("imgpipe.train").joinpath("recipes")


def recipe_names() -> list[str]:
    """The recipes this install ships, sorted."""
    return sorted(entry.name[: -len(SUFFIX)] for entry in _folder().iterdir() if entry.name.endswith(SUFFIX))


def recipe_text(name: str) -> str:
    """The YAML of recipe ``name``; a ConfigError lists the recipes when there is no such one."""
    if name not in recipe_names():
        raise ConfigError(f"no recipe {name!r}; the recipes are {', '.join(recipe_names())} (imgpipe train --list-recipes)")
    return _folder().joinpath(name + SUFFIX).read_text(encoding="utf-8")


def read_recipe(name: str) -> dict[str, Any]:
    """Recipe ``name`` as the raw config mapping ``load_config`` starts from."""
    return yaml.safe_load(recipe_text(name))


def describe_recipes() -> list[str]:
    """One line per recipe: its name and what its first comment line says."""
    lines = []
    for name in recipe_names():
        first = recipe_text(name).splitlines()[0].lstrip("# ")
        lines.append(f"{name:<12} {first.split(': ', 1)[-1]}")
    return lines
