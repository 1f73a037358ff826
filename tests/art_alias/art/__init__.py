"""``art`` meaning ``dgrpo``, for running ART's own unit tests unchanged against dgrpo (tests only; never
installed). With ``tests/art_alias`` on ``sys.path``, ``import art`` is ``dgrpo`` and ``art.<module>`` is the
same module object as ``dgrpo.<module>`` (not a second copy, so classes compare equal):

    PYTHONPATH=$PWD:$PWD/tests/art_alias python -m pytest <ART checkout>/tests/unit/test_strip_logprobs.py \
        -p no:cacheprovider -o asyncio_mode=auto

docs/art-compat.md lists which of ART's test files pass this way.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import dgrpo

# Every dgrpo module is registered under its art name before any is imported as art.<name>: importing one
# fresh would rebind its parent's attribute (art.utils.iterate_dataset, a function, to its module). The
# `dgrpo` command (dgrpo.cli) and its ART server (dgrpo.art_server, which needs FastAPI) are not ART's API, and the
# CLI's __main__ would run it. A refused ART path has no file here: `import art.<path>` raises as
# `import dgrpo.<path>` does (dgrpo/art_compat/refusals.py).
NOT_ART = ("dgrpo.cli", "dgrpo.art_server")
for _info in pkgutil.walk_packages(dgrpo.__path__, "dgrpo."):
    if _info.name in NOT_ART or _info.name.startswith(tuple(f"{name}." for name in NOT_ART)):
        continue
    sys.modules["art" + _info.name.removeprefix("dgrpo")] = importlib.import_module(_info.name)
sys.modules[__name__] = dgrpo
