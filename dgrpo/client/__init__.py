"""dgrpo's own client logic behind ART's façade (``dgrpo.model``'s ``Model`` and ``TrainableModel``, the backends):
``model_base`` (what every model has: naming, ``log``, metrics builders), ``openai_client`` (the model's wrapped
OpenAI client), ``registration`` (what ``register`` does on the cluster); the backends: ``backends`` (the
``Backend`` protocol and the cluster connection), ``training`` (ART's ``backend.train`` and the seam a model
asks), ``temporal_backend`` (``TemporalBackend``); the durable calls a backend makes: ``train_step`` (a
``TrainStep``), ``sft`` (a ``TrainSFT``), ``attach`` (joining a workflow another client started); and
``run_control`` (start, steer and watch ``TrainingRun`` workflows)."""
