"""``python -m dgrpo.cli``: the ``dgrpo`` command (how workers/launcher.py starts worker processes)."""

from dgrpo.cli import entry

entry()
