"""ART's ``art.utils.deploy_model``: refused, saying why (dgrpo/art_refusals.py)."""

from dgrpo.art_refusals import refuse_module

refuse_module(__name__)
