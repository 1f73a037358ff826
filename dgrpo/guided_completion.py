"""ART's ``art.guided_completion``: refused, saying why (dgrpo/art_refusals.py)."""

from dgrpo.art_refusals import refuse_module

refuse_module(__name__)
