"""ART's ``art.api_costs`` module path: ``track_api_cost`` (a decorated API call's cost logged under
``costs/<split>/<source>``) and ``TokenPricing``, both dgrpo/costs.py's."""

from __future__ import annotations

from dgrpo.costs import TokenPricing, track_api_cost

__all__ = ["TokenPricing", "track_api_cost"]
