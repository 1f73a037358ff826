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
from dgrpo.errors import UnsupportedArtFeature

# Every dgrpo module is registered under its art name before any is imported as art.<name>: importing one
# fresh would rebind its parent's attribute (art.utils.iterate_dataset, a function, to its module).
for _info in pkgutil.walk_packages(dgrpo.__path__, "dgrpo."):
    try:
        _module = importlib.import_module(_info.name)
    except UnsupportedArtFeature:
        continue  # a refused ART path (dgrpo/art_refusals.py): `import art.<path>` raises the same error
    sys.modules["art" + _info.name.removeprefix("dgrpo")] = _module
sys.modules[__name__] = dgrpo
