"""ART's ``art.utils.benchmarking``: the trajectories ``model.log`` wrote, as one table to compare models by
(``load_trajectories``). Needs polars (``pip install polars``), as ART's does."""
