"""ART's ``get_repo_root_path``: the root of the git checkout this package lives in, ``"."`` when there is none
(an installed package), as ART's answers for ``art``."""

from __future__ import annotations

from pathlib import Path


def get_repo_root_path() -> str:
    """The nearest directory above this package holding ``.git``, else ``"."``."""
    for directory in Path(__file__).resolve().parents:
        if (directory / ".git").exists():
            return str(directory)
    return "."
