"""What ``model.log`` (and ``model.train``) write: ``run_metrics`` (a step's row, under ART's names, in the
run's metrics Parquet in the object store) and ``local_files`` (ART's local files under ``base_path``:
``history.jsonl``, trajectory Parquet, ``state.json``)."""
